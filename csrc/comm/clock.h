// The two clocks zcoll reads, both monotonic and shared by every process of one machine.
//
// coarse_ns: CLOCK_MONOTONIC_COARSE, the kernel's last tick (1-4 ms resolution), read from the
//            vDSO without a syscall in ~5 ns. Enough for deadlines and 100 ms liveness checks.
// fine_ns:   CLOCK_MONOTONIC, nanosecond resolution, ~20 ns through the vDSO. For the link
//            telemetry, whose message times are microseconds.
// Under SimGrid's SMPI (ZCOLL_WITH_SMPI) both read the simulated clock: deadlines, link telemetry
// and comm.link_stats() then measure the simulated platform, not the host running the simulation.
#pragma once
#include <time.h>

#include <cstdint>

#include "config.h"
#if ZCOLL_WITH_SMPI
#include <smpi/smpi_helpers_internal.h>
#endif

namespace zcoll {

inline std::int64_t clock_ns(clockid_t clock) {
  timespec ts;
#if ZCOLL_WITH_SMPI
  smpi_clock_gettime(clock, &ts);
#else
  clock_gettime(clock, &ts);
#endif
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
inline std::int64_t coarse_ns() { return clock_ns(CLOCK_MONOTONIC_COARSE); }
inline std::int64_t fine_ns() { return clock_ns(CLOCK_MONOTONIC); }

inline constexpr std::int64_t kNsPerSecond = 1000000000;

}  // namespace zcoll
