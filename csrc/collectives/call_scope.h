// The one per-collective record: every public entry point (allreduce, reduce_scatter, allgather,
// broadcast, reduce, barrier, the compressed allreduce) opens a CallScope after validating its
// arguments and before its first message. The scope
//   1. throws BrokenError at once when an earlier failure broke the communicator;
//   2. numbers the call (the same sequence number on every rank) and starts its deadline
//      (comm/watchdog.h);
//   3. opens the call's flight-recorder record (comm/flight_recorder.h) and notes its arrival
//      time for the link telemetry (comm/telemetry.h);
//   4. ends both when it leaves: done, or failed when an exception leaves the call, and counts
//      the call by collective, algorithm and size (comm/call_stats.h, for metrics).
// A collective that runs another (the compressed allreduce without compression) is one call.
#pragma once
#include <cstddef>
#include <exception>

#include "collectives/options.h"
#include "comm/communicator.h"

namespace zcoll::detail {

// What the call is. The strings are literals (records keep the pointers).
struct CallInfo {
  const char* collective = "";  // "allreduce"
  std::size_t count = 0;        // elements of this rank's input
  DType dtype = DType::kFloat32;
  const char* algorithm = "";   // the algorithm that runs ("ring"), or the compression
  const char* op = "";          // reductions: "sum", ...
  int root = -1;                // rooted collectives
};

class CallScope {
 public:
  CallScope(Communicator& comm, const CallInfo& info)
      : comm_(comm), info_(info), exceptions_(std::uncaught_exceptions()) {
    const std::size_t bytes = info.count * dtype_size(info.dtype);
    bytes_ = bytes;
    outermost_ = !comm.watchdog().in_call();
    const std::uint64_t seq = comm.watchdog().begin_call(info.collective, bytes);
    if (!outermost_) return;
    CallDescription d;
    d.seq = seq;
    d.collective = info.collective;
    d.algorithm = info.algorithm;
    d.dtype = dtype_name(info.dtype);
    d.op = info.op;
    d.count = info.count;
    d.bytes = bytes;
    d.root = info.root;
    comm.recorder().begin(d);
    comm.telemetry().arrived();
  }
  ~CallScope() {
    if (outermost_) {
      comm_.recorder().end(std::uncaught_exceptions() > exceptions_);
      comm_.telemetry().left(info_.collective, info_.algorithm, bytes_);
    }
    comm_.watchdog().end_call();
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  Communicator& comm_;
  CallInfo info_;
  std::size_t bytes_ = 0;
  int exceptions_;
  bool outermost_ = true;
};

}  // namespace zcoll::detail
