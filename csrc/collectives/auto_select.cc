// The choice behind algorithm "auto": one table of (max ranks, max bytes) -> algorithm, read
// top to bottom, first match wins. The thresholds come from the cost model in
// docs/algorithms.md, checked against zcoll_allreduce_perf runs on 2 and 4 ranks; a measured
// table (from a tuner) can replace this one without touching the algorithms.
#include <cstddef>
#include <limits>

#include "collectives/options.h"

namespace zcoll {
namespace {

struct Rule {
  int max_ranks;
  std::size_t max_bytes;
  Algorithm algorithm;
};

constexpr std::size_t kAny = std::numeric_limits<std::size_t>::max();

constexpr Rule kRules[] = {
    {2, kAny, Algorithm::kRing},
    {1 << 30, 32 * 1024, Algorithm::kRecursiveDoubling},
    {1 << 30, kAny, Algorithm::kRing},
};

}  // namespace

Algorithm choose_allreduce_algorithm(std::size_t bytes, int ranks) {
  for (const Rule& rule : kRules)
    if (ranks <= rule.max_ranks && bytes <= rule.max_bytes) return rule.algorithm;
  return Algorithm::kRing;
}

}  // namespace zcoll
