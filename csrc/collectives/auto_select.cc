// The choice behind algorithm "auto": one table of rules, read top to bottom, first match wins.
// The thresholds come from the cost model in docs/algorithms.md, checked against
// zcoll_allreduce_perf runs on 2 and 4 ranks; a measured table (from a tuner) can replace this
// one without touching the algorithms.
//
// 1. Every rank on one node: `shm` at every size (measured fastest from 4 KiB to 64 MiB on 2
//    and 4 ranks, oversubscribed included).
// 2. On several nodes with the same number (> 1) of ranks each, up to 8 KiB: recursive doubling
//    (fewest steps). MPI's shared-memory advantage (rule 3) is a one-node one: simulated at 16
//    and 64 ranks on fat trees (docs/scale.md), MPICH's algorithms took 3.4x and 8.6x zcoll's
//    recursive doubling at 4 KiB.
// 3. Otherwise, up to 64 KiB, MPI's own allreduce when it is not oversubscribed: MPICH runs
//    small allreduces on shared-memory collectives that beat any algorithm built on
//    point-to-point messages (one MPI_Sendrecv of 4 KiB costs more than its whole 4 KiB
//    allreduce here); with ranks outnumbering cores those collectives busy-spin and take
//    seconds per call, so not then.
// 4. Recursive doubling up to 32 KiB (fewest steps).
// 5. Ranks on several nodes with the same number (> 1) on each: `hierarchical`, where it wins.
//    Its node-local stages add 2(L-1)/L S at the node's shared-memory bandwidth B_node; its
//    inter-node stage puts 2(N-1)/N S on a node's link against 2(p-1)/p S for a ring in blocked
//    rank order (one crossing hop per node): (L-1)/p S less. So on bandwidth it beats the ring
//    only while B_node / B_link > N, the node count (docs/algorithms.md), which holds on few
//    nodes (5a: N <= kHierarchyAnySizeNodes; the 2 x 2 test bed at 1 Gbit/s: 1.58x the ring)
//    and fails on many (simulated, 12.5 GB/s links and 20 GB/s nodes: 1.2-1.4x the ring's time
//    at 1-16 MiB on 8 nodes, docs/scale.md). On latency it always wins: 2(N-1) + 2(L-1) steps
//    against the ring's 2(p-1), which pays up to a size that grows with p (5b: S <= p x
//    kHierarchicalBytesPerRank; simulated crossovers between 64 and 256 KiB at 16 ranks, 256 KiB
//    and 1 MiB at 64, ...). Node count not known (zcoll.choose_algorithm without nodes): 5a.
//    Not on nodes of different sizes: their extra ranks' fold is serial and one node of many
//    extras can cost more than the link saves (algorithm='hierarchical' still runs there).
// 6. A known topology (ZCOLL_TOPOLOGY, set_topology) whose best ring order has a slowest hop at
//    least kOrderedRingGain times faster than rank order's: `ordered_ring` (a ring's time is its
//    slowest hop's; below that gain, measurement noise may be all the difference).
// 7. The ring.
// A rule applies only where the communicator offers what its algorithm needs: those needs are
// the algorithm's descriptor's (algorithm_table.h: shm needs shared memory, mpi a native
// allreduce, which auto counts only when not oversubscribed, ordered_ring measured links); the
// rules add only their own conditions (sizes, equal nodes, the ring's gain).
#include <cstddef>
#include <limits>

#include "collectives/algorithm_table.h"
#include "collectives/options.h"

namespace zcoll {
namespace {

struct Rule {
  int max_ranks;
  std::size_t max_bytes;
  bool needs_node_hierarchy;
  double min_ordered_ring_gain;  // 0: no condition
  Algorithm algorithm;
  std::size_t max_bytes_per_rank = 0;  // also bytes <= ranks x this; 0: no condition
  int max_nodes = 0;                   // also at most this many nodes (0 nodes: unknown, matches); 0: any
};

constexpr std::size_t kAny = std::numeric_limits<std::size_t>::max();
constexpr int kAnyRanks = std::numeric_limits<int>::max();
constexpr double kOrderedRingGain = 1.25;
constexpr int kHierarchyAnySizeNodes = 2;
constexpr std::size_t kHierarchicalBytesPerRank = 4 * 1024;

constexpr Rule kRules[] = {
    {kAnyRanks, kAny, false, 0.0, Algorithm::kShm},
    {kAnyRanks, 8 * 1024, true, 0.0, Algorithm::kRecursiveDoubling},
    {kAnyRanks, 64 * 1024, false, 0.0, Algorithm::kMpi},
    {kAnyRanks, 32 * 1024, false, 0.0, Algorithm::kRecursiveDoubling},
    {kAnyRanks, kAny, true, 0.0, Algorithm::kHierarchical, 0, kHierarchyAnySizeNodes},
    {kAnyRanks, kAny, true, 0.0, Algorithm::kHierarchical, kHierarchicalBytesPerRank},
    {kAnyRanks, kAny, false, kOrderedRingGain, Algorithm::kOrderedRing},
    {kAnyRanks, kAny, false, 0.0, Algorithm::kRing},
};

bool matches(const Rule& rule, std::size_t bytes, int ranks, const Capabilities& caps, unsigned offered) {
  const unsigned needs = allreduce_algorithm(rule.algorithm).needs;
  return ranks <= rule.max_ranks && bytes <= rule.max_bytes && (needs & ~offered) == 0 &&
         (caps.node_hierarchy || !rule.needs_node_hierarchy) &&
         caps.ordered_ring_gain >= rule.min_ordered_ring_gain &&
         (rule.max_bytes_per_rank == 0 || bytes <= rule.max_bytes_per_rank * static_cast<std::size_t>(ranks)) &&
         (rule.max_nodes == 0 || caps.nodes <= rule.max_nodes);
}

}  // namespace

Algorithm choose_allreduce_algorithm(std::size_t bytes, int ranks, const Capabilities& caps) {
  const unsigned offered = offered_needs(caps);
  for (const Rule& rule : kRules)
    if (matches(rule, bytes, ranks, caps, offered)) return rule.algorithm;
  return Algorithm::kRing;
}

}  // namespace zcoll
