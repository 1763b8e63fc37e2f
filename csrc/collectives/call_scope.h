// The one per-collective record: every public entry point (allreduce, reduce_scatter, allgather,
// broadcast, reduce, barrier, the compressed allreduce) opens a CallScope after validating its
// arguments and before its first message. The scope
//   1. throws BrokenError at once when an earlier failure broke the communicator;
//   2. numbers the call (the same sequence number on every rank) and starts its deadline
//      (comm/watchdog.h);
//   3. ends the call when it leaves, normally or by an exception.
// A collective that runs another (the compressed allreduce without compression) is one call.
#pragma once
#include <cstddef>

#include "collectives/options.h"
#include "comm/communicator.h"

namespace zcoll::detail {

// What the call is, for failure messages.
struct CallInfo {
  const char* collective = "";  // a string literal: "allreduce"
  std::size_t count = 0;        // elements of this rank's input
  DType dtype = DType::kFloat32;
};

class CallScope {
 public:
  CallScope(Communicator& comm, const CallInfo& info) : comm_(comm) {
    comm.watchdog().begin_call(info.collective, info.count * dtype_size(info.dtype));
  }
  ~CallScope() { comm_.watchdog().end_call(); }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  Communicator& comm_;
};

}  // namespace zcoll::detail
