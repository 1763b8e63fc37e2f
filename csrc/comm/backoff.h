// How a rank waits for a peer: poll, and after a while give the core away between polls.
//
// Spinning is the fastest wait when every rank has a core of its own; when ranks outnumber
// cores (or something else runs on the machine) a spinning rank can hold the very core its peer
// needs, and a wait that should take microseconds takes a scheduler tick. So every wait spins
// for a bounded number of polls (kSpinPolls, tens of microseconds) and then calls sched_yield()
// between polls; with the yield policy (oversubscribed nodes) it yields almost at once.
#pragma once
#include <sched.h>

namespace zcoll {

class Backoff {
 public:
  explicit Backoff(bool yield_early) : limit_(yield_early ? kYieldPolls : kSpinPolls) {}

  // Call once per unsuccessful poll.
  void pause() {
    if (polls_ < limit_) {
      ++polls_;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    } else {
      sched_yield();
    }
  }

 private:
  static constexpr int kSpinPolls = 4096;
  static constexpr int kYieldPolls = 64;
  int limit_;
  int polls_ = 0;
};

}  // namespace zcoll
