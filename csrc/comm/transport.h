// The transport interface: moving bytes between ranks, and nothing else (Gloo's transport::Pair).
// A transport is rank, size and non-blocking point-to-point (isend, irecv, wait, test, cancel);
// what failure detection needs from the wire is the small PeerMonitor beside it, and what a
// transport may offer beyond messages are optional capabilities it returns when it has them
// (NativeAllreduce, SharedMemory). MPI (mpi_communicator.h) and the in-process threads of the C++
// tests (inproc_communicator.h) are the two implementations; a shared-memory or GPU transport
// implements these and nothing of the engine.
//
// The engine (comm/communicator.h) owns the transport and composes it with the watchdog, flight
// recorder, telemetry, topology, scratch and statistics; algorithms only ever see the engine.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/shared_arena.h"
#include "comm/watchdog.h"
#include "common/dtype.h"

namespace zcoll {

// An in-flight send or receive. The transport owns the meaning of `handle` and sets `peer`, the
// rank on the other end (what a wait that fails names); the engine's Channel sets `bytes` and
// `send` for its records.
struct Request {
  std::uint64_t handle = 0;
  std::uint64_t bytes = 0;
  int peer = -1;
  bool active = false;
  bool send = false;
};

// Failure detection's view of the wire, for the watchdog (comm/watchdog.h):
//   peer_alive:        false once the peer's process is known to be gone;
//   describe_peer:     what is known about the peer's process, for messages ("" if nothing);
//   peer_process:      the peer's process state where this rank can see it (kUnknown if not);
//   announce:          `status` to every other rank, without blocking, on a channel of its own;
//   next_announcement: one announcement received from another rank, if any;
//   check:             throws when the transport itself has failed (an aborted group);
//   shares_clock:      the peer reads the same CLOCK_MONOTONIC as this rank (one machine), so
//                      link telemetry compares their times directly instead of measuring the
//                      offset first.
class PeerMonitor {
 public:
  virtual ~PeerMonitor() = default;
  virtual bool peer_alive(int peer) = 0;
  virtual std::string describe_peer(int) { return ""; }
  virtual ProcessState peer_process(int) { return ProcessState::kUnknown; }
  virtual void announce(const PeerStatus& status) = 0;
  virtual bool next_announcement(PeerStatus& status) = 0;
  virtual void check() {}
  virtual bool shares_clock(int) const { return true; }
};

// Optional: the transport's own allreduce (MPI_Allreduce), offered as algorithm "mpi". Waits
// poll the transport's watchdog like every other wait.
class NativeAllreduce {
 public:
  virtual ~NativeAllreduce() = default;
  virtual void allreduce(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) = 0;
};

// Optional: memory shared by every rank of one node. The first arena() call allocates it and is
// collective (every rank must call it; algorithms that use it are chosen identically on every
// rank); later calls return the same arena. The engine asks only when every rank is on one node.
class SharedMemory {
 public:
  virtual ~SharedMemory() = default;
  virtual SharedArena* arena() = 0;
};

class Transport {
 public:
  Transport() = default;
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Messages between one pair of ranks with one tag arrive in the order they were sent.
  virtual Request isend(const void* buf, std::size_t bytes, int peer, int tag) = 0;
  virtual Request irecv(void* buf, std::size_t bytes, int peer, int tag) = 0;
  // Calls watchdog().poll(peer) between unsuccessful polls (or check() when a blocking wait
  // wakes up), so it ends at the call's deadline or when a peer is lost.
  virtual void wait(Request& request) = 0;
  // True when the request has completed (it is then inactive, as after wait); false while it is
  // in flight. Also lets a transport without its own progress thread move messages along, so an
  // algorithm that computes between messages calls it now and then.
  virtual bool test(Request& request) = 0;
  // Abandons an in-flight request after a failure (the engine does, for every request of a
  // collective that throws): a receive never writes into its buffer afterwards; a send may or
  // may not be delivered, and is never matched by a later receive of this transport's peer
  // when the transport can prevent it. The request becomes inactive. Never throws.
  virtual void cancel(Request& request) noexcept = 0;

  // What failure detection needs from the wire; the optional capabilities (null: not offered).
  // Each answer is fixed for the transport's life.
  virtual PeerMonitor& monitor() = 0;
  virtual NativeAllreduce* native_allreduce() { return nullptr; }
  virtual SharedMemory* shared_memory() { return nullptr; }

  // The engine's watchdog, which the transport's waits poll; attached once by the Communicator
  // that owns the transport, before any message.
  void attach(Watchdog& watchdog) { watchdog_ = &watchdog; }

 protected:
  Watchdog& watchdog() const { return *watchdog_; }

 private:
  Watchdog* watchdog_ = nullptr;
};

}  // namespace zcoll
