// One bind_* function per area, called from module.cc, and what the areas share: the C++ half
// of zcoll.Communicator and the GIL policy of blocking calls.
#pragma once
#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "collectives/options.h"
#include "comm/mpi_communicator.h"

namespace zcoll::bindings {

// What Communicator.shrink() found: rank r of the new communicator was rank kept[r] of the old.
struct ShrinkReport {
  std::vector<int> kept, lost;
  int parent_size = 0;
  double seconds = 0.0;  // revoke, shrink and agreement on this rank
};

// zcoll._C.Comm, the base class of zcoll.Communicator (python/zcoll/communicator.py): owns the
// MpiCommunicator and the options every call passes down. Its collective methods take the
// caller's objects (bind_collectives.cc) and check everything in C++.
class CommHandle {
 public:
  CommHandle(long long fortran_handle, bool check);
  // The survivors' communicator of a shrink, with the parent's options (bind_shrink.cc).
  CommHandle(std::unique_ptr<MpiCommunicator> comm, const CommHandle& parent);
  // Warns (ResourceWarning) when the communicator was never freed; frees nothing (collective
  // calls from garbage collection would run in a different order on every rank).
  ~CommHandle();
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;

  // ValueError once freed.
  MpiCommunicator& comm() {
    if (!comm_) throw std::invalid_argument("this zcoll.Communicator has been freed; create a new one");
    return *comm_;
  }
  bool freed() const { return !comm_; }
  // Collective. Call without the GIL; MPI errors raise ZcollError.
  void free();

  PipelineOptions pipeline;  // Python: segment_bytes, pipeline_depth (0: the defaults)
  bool check = false;        // exchange a header before each collective (MismatchError)
  ShrinkReport shrunk_from;  // what the shrink that made this communicator found (parent_size 0: none)

 private:
  std::unique_ptr<MpiCommunicator> comm_;
};

// GIL policy: a call that can wait for another rank, or copy long, runs without the GIL, so
// other Python threads (the torch backend's executor, the caller's) run meanwhile. A one-rank
// call below kGilFreeBytes keeps it: it is a copy of at most a few microseconds, and giving the
// GIL away is not free. Releasing and re-taking it costs ~60 ns when no other thread wants it
// (measured here); when another Python thread is runnable, re-taking it waits until that thread
// lets go (up to sys.getswitchinterval(), 5 ms), which would dwarf a 4-byte allreduce.
inline constexpr std::size_t kGilFreeBytes = 64 * 1024;
inline bool may_block(const Communicator& comm, std::size_t bytes) {
  return comm.size() > 1 || bytes >= kGilFreeBytes;
}

// Releases the GIL for its lifetime when asked to.
class MaybeReleaseGil {
 public:
  explicit MaybeReleaseGil(bool release) : state_(release ? PyEval_SaveThread() : nullptr) {}
  ~MaybeReleaseGil() {
    if (state_) PyEval_RestoreThread(state_);
  }
  MaybeReleaseGil(const MaybeReleaseGil&) = delete;
  MaybeReleaseGil& operator=(const MaybeReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

void bind_enums(pybind11::module_& m);
pybind11::class_<CommHandle> bind_comm(pybind11::module_& m);
void bind_collectives(pybind11::module_& m, pybind11::class_<CommHandle>& comm);
void bind_kernels(pybind11::module_& m);
void bind_compression(pybind11::module_& m);
void bind_compressed(pybind11::module_& m);
void bind_env(pybind11::module_& m);
void bind_shrink(pybind11::module_& m, pybind11::class_<CommHandle>& comm);
}  // namespace zcoll::bindings
