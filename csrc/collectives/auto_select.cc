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
  Algorithm algorithm;
};

constexpr std::size_t kAny = std::numeric_limits<std::size_t>::max();
constexpr int kAnyRanks = std::numeric_limits<int>::max();

constexpr Rule kRules[] = {
    {kAnyRanks, 64 * 1024, true, Algorithm::kMpi},
    {kAnyRanks, 32 * 1024, false, Algorithm::kRecursiveDoubling},
    {2, kAny, false, Algorithm::kRing},
    {kAnyRanks, kAny, false, Algorithm::kRing},
};

}  // namespace

Algorithm choose_allreduce_algorithm(std::size_t bytes, int ranks, bool native_fast) {
  for (const Rule& rule : kRules)
    if (ranks <= rule.max_ranks && bytes <= rule.max_bytes && (native_fast || !rule.needs_native_fast))
      return rule.algorithm;
  return Algorithm::kRing;
}

}  // namespace zcoll
