// How a rank waits for a peer: poll, then give the core away, then sleep.
//
// Spinning is the fastest wait when every rank has a core of its own and the peer is about to
// answer. But a rank often waits for long: for a slow link (a 128 KiB segment takes 1 ms at
// 1 Gbit/s), for a peer that is still computing, or as a communication thread that shares its
// core with the training loop's compute (DDP's buckets run on a worker thread). Spinning, or
// even calling sched_yield() in a loop, then takes CPU time from the very computation the
// communication is meant to hide behind: on the emulated 1 Gbit/s link, an 8.5 MB ring
// allreduce (136 waits) burned 100 ms of CPU in 155 ms when every wait spun 4096 MPI_Tests.
// So a wait has three phases, bounded by time, not by polls (a poll may cost 20 ns or 2 us):
//   1. spin: poll with a pause instruction for kSpinNs (only kYieldPolls polls when ranks
//      outnumber cores: the peer needs this core to make progress);
//   2. yield: sched_yield() between polls until the wait has lasted kYieldNs;
//   3. sleep: nanosleep between polls, for 1/8 of the time waited so far, between kMinSleepNs
//      and kMaxSleepNs. A wait of T costs at most T/8 (capped at 200 us) of extra latency, and
//      a long wait costs almost no CPU.
// The clock is read every kPollsPerClock polls while spinning, then at every poll (where a
// system call is made anyway).
#pragma once
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstdint>

namespace zcoll {

class Backoff {
 public:
  explicit Backoff(bool yield_early) : yield_early_(yield_early) {}

  // Call once per unsuccessful poll.
  void pause() {
    ++polls_;
    if (spinning_) {
      if (start_ == 0) start_ = now_ns();
      const bool spin_more = yield_early_ ? polls_ < kYieldPolls
                                          : polls_ % kPollsPerClock != 0 || now_ns() - start_ < kSpinNs;
      if (spin_more) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
        return;
      }
      spinning_ = false;
    }
    const std::int64_t waited = now_ns() - start_;
    if (waited < kYieldNs) {
      sched_yield();
      return;
    }
    sleep_ns(std::clamp(waited / 8, kMinSleepNs, kMaxSleepNs));
  }

  // Nanoseconds since the wait began (its first unsuccessful poll).
  std::int64_t waited_ns() const { return start_ ? now_ns() - start_ : 0; }

 private:
  static constexpr int kYieldPolls = 64;
  static constexpr int kPollsPerClock = 16;
  static constexpr std::int64_t kSpinNs = 20'000;       // 20 us of spinning
  static constexpr std::int64_t kYieldNs = 50'000;      // then yielding until 50 us
  static constexpr std::int64_t kMinSleepNs = 10'000;   // then sleeps of 10-200 us
  static constexpr std::int64_t kMaxSleepNs = 200'000;

  static std::int64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }
  static void sleep_ns(std::int64_t ns) {
    timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    nanosleep(&ts, nullptr);
  }

  bool yield_early_;
  bool spinning_ = true;
  int polls_ = 0;
  std::int64_t start_ = 0;
};

}  // namespace zcoll
