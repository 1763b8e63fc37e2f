// The choice behind algorithm "auto": one table of rules, read top to bottom, first match wins.
// The thresholds come from the cost model in docs/algorithms.md, checked against
// zcoll_allreduce_perf runs on 2 and 4 ranks; a measured table (from a tuner) can replace this
// one without touching the algorithms.
//
// 1. Every rank on one node: `shm` at every size (measured fastest from 4 KiB to 64 MiB on 2
//    and 4 ranks, oversubscribed included).
// 2. Otherwise, up to 64 KiB, MPI's own allreduce when it is not oversubscribed: MPICH runs
//    small allreduces on shared-memory collectives that beat any algorithm built on
//    point-to-point messages (one MPI_Sendrecv of 4 KiB costs more than its whole 4 KiB
//    allreduce here); with ranks outnumbering cores those collectives busy-spin and take
//    seconds per call, so not then.
// 3. Recursive doubling up to 32 KiB (fewest steps), the ring above.
#include <cstddef>
#include <limits>

#include "collectives/options.h"

namespace zcoll {
namespace {

struct Rule {
  int max_ranks;
  std::size_t max_bytes;
  bool needs_native_fast;
  bool needs_shared_memory;
  Algorithm algorithm;
};

constexpr std::size_t kAny = std::numeric_limits<std::size_t>::max();
constexpr int kAnyRanks = std::numeric_limits<int>::max();

constexpr Rule kRules[] = {
    {kAnyRanks, kAny, false, true, Algorithm::kShm},
    {kAnyRanks, 64 * 1024, true, false, Algorithm::kMpi},
    {kAnyRanks, 32 * 1024, false, false, Algorithm::kRecursiveDoubling},
    {kAnyRanks, kAny, false, false, Algorithm::kRing},
};

}  // namespace

Algorithm choose_allreduce_algorithm(std::size_t bytes, int ranks, const Capabilities& caps) {
  for (const Rule& rule : kRules)
    if (ranks <= rule.max_ranks && bytes <= rule.max_bytes && (caps.native_fast || !rule.needs_native_fast) &&
        (caps.shared_memory || !rule.needs_shared_memory))
      return rule.algorithm;
  return Algorithm::kRing;
}

}  // namespace zcoll
