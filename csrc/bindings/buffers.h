// Arrays from Python, taken in C++ (the model: nanobind's nb::ndarray, mpi4py's buffer
// acquisition): numpy arrays, CPU torch tensors, DLPack producers and buffer-protocol objects
// become one Buffer (address, element count, zcoll dtype), checked once, here, with errors that
// name the argument ('x', 'out'). Nothing is copied and torch is never imported.
#pragma once
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"

namespace zcoll::bindings {

enum class Access { kRead, kWrite };

// A contiguous CPU buffer of a Python object, borrowed for the length of one call. It holds
// what the object's protocol requires until it is destroyed (a Py_buffer to release, a DLPack
// tensor whose deleter must run), so destroy it with the GIL held, after the collective.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  std::size_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  std::size_t nbytes() const { return nbytes_; }
  bool readonly() const { return readonly_; }
  // The object's shape (a torch tensor is asked for it; the others keep it in their view).
  std::vector<long long> shape() const;

 private:
  friend struct BufferAccess;
  void set(void* data, std::size_t count, DType dtype, bool readonly);
  void release() noexcept;

  void* data_ = nullptr;
  std::size_t count_ = 0;
  std::size_t nbytes_ = 0;
  DType dtype_ = DType::kFloat32;
  bool readonly_ = false;
  // Where the shape lives and what to give back.
  PyObject* object_ = nullptr;  // borrowed: alive for the call (the caller's argument)
  int ndim_ = 0;
  const Py_ssize_t* dims_ = nullptr;       // numpy, buffer protocol
  const std::int64_t* dl_dims_ = nullptr;  // DLPack
  bool torch_ = false;
  bool has_view_ = false;
  Py_buffer view_{};
  void* dl_managed_ = nullptr;  // DLManagedTensor(Versioned) whose deleter we owe
  bool dl_versioned_ = false;
};

// Takes obj's memory: a numpy array (any ndarray; read straight from its struct), a CPU torch
// tensor (recognised once torch is in sys.modules; read through data_ptr(), dtype, is_cpu,
// is_contiguous(), numel()), an object with __dlpack__ (versioned capsules preferred, with
// their read-only flag), or the buffer protocol (format characters with '@', '=', '<' prefixes).
// Raises ValueError (unsupported dtype, not contiguous, not on the CPU, read-only for kWrite)
// or TypeError (none of these), each naming `name`.
Buffer acquire(pybind11::handle obj, const char* name, Access access);

// out must hold `count` elements of x's dtype (ValueError naming `name` otherwise).
void require_like(const Buffer& out, const Buffer& x, std::size_t count, const char* name);

// Input and output may be disjoint, or `in` may sit exactly `in_place_offset` bytes after the
// start of `out` (negative: before it): the collective's in-place form (0 for allreduce and
// reduce, this rank's block for allgather and reduce_scatter). Any other overlap is a
// ValueError naming both; `in_place_form` says how to ask for in place.
void require_disjoint_or_in_place(const Buffer& in, const Buffer& out, std::ptrdiff_t in_place_offset,
                                  const char* in_place_form);

// x and out of a call, where out may be x itself (then taken once, for writing).
struct InOut {
  Buffer in, out;
  bool same = false;
  Buffer& result() { return same ? in : out; }
};
InOut take_in(pybind11::handle x, pybind11::handle out);
// Takes out (unless it is x): `count` elements of x's dtype, disjoint from x or in its
// in-place position (require_disjoint_or_in_place).
void take_out(InOut& b, pybind11::handle out, std::size_t count, std::ptrdiff_t in_place_offset,
              const char* in_place_form);

}  // namespace zcoll::bindings
