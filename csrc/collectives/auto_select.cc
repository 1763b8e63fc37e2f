// The choice behind algorithm "auto": one table of rules, read top to bottom, first match wins.
// The thresholds come from the cost model in docs/algorithms.md, checked against
// zcoll_allreduce_perf runs on 2 and 4 ranks; a measured table (from a tuner) can replace this
// one without touching the algorithms.
//
// Below 64 KiB MPICH's allreduce runs on its own shared-memory collectives, which beat any
// algorithm built on point-to-point messages (one MPI_Sendrecv of 4 KiB costs more than its
// whole 4 KiB allreduce here), so `auto` hands small messages to MPI - unless ranks outnumber
// cores, where those collectives busy-spin and take seconds per call.
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
    {kAnyRanks, 64 * 1024, true, false, Algorithm::kMpi},
    {kAnyRanks, kAny, false, true, Algorithm::kShm},
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
