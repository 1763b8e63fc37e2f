// The choice behind algorithm "auto": one table of rules, read top to bottom, first match wins.
// The thresholds come from the cost model in docs/algorithms.md, checked against
// zcoll_allreduce_perf runs on 2 and 4 ranks and simulated ones on 16 to 1,024 (docs/scale.md); a
// measured table (from a tuner) can replace this
// one without touching the algorithms.
//
// 1. Every rank on one node: `shm` at every size (measured fastest from 4 KiB to 64 MiB on 2
//    and 4 ranks, oversubscribed included). On 2 ranks at 64-128 KiB a loop over one unchanged
//    buffer (./dev.sh bench) finds recursive doubling faster (0.68-0.91 of shm's time): MPICH
//    sends its one exchange with a single kernel copy (CMA) that reads the peer's input, still
//    cached unmodified from the call before, where shm's window is rewritten every call. On an
//    input its owner rewrote just before the call, as a fresh gradient, recursive doubling took
//    1.35-1.62x shm's time, and 1.41-1.92x on cold buffers (docs/results.md), so shm stays.
// 2. On several nodes with the same number (> 1) of ranks each, up to 8 KiB: recursive doubling
//    (fewest steps). MPI's shared-memory advantage (rule 4) is a one-node one: simulated at 16
//    and 64 ranks on fat trees (docs/scale.md), MPICH's algorithms took 3.4x and 8.6x zcoll's
//    recursive doubling at 4 KiB. On 3 or more such nodes halving-doubling instead, which sends
//    each rank's bytes once rather than log p times: simulated at 4 KiB, recursive doubling took
//    1.16x its time on 256 ranks (2:1 fat tree) and 1.21x on 64 (dragonfly), halving-doubling
//    1.01-1.03x recursive doubling's on 16 and 64 ranks. On 3 or more nodes halving-doubling also
//    above 8 KiB while the message is under hierarchical's latency crossover (below). Both bounds
//    are where halving-doubling's link bytes start to cost more than hierarchical's extra steps,
//    so a slow node (rule 3) divides both by its factor; recursive doubling is for 2 nodes (or a
//    count not known) only.
// 3. On 3 or more such nodes, up to ranks x kHierarchicalBytesPerRank: `hierarchical`, for its
//    latency: 2(N-1) + 2(L-1) steps against the ring's 2(p-1) and no rank sending the whole
//    message log p times (recursive doubling, MPI's small-message algorithms). Simulated on a
//    2:1 fat tree (docs/scale.md) it is the fastest zcoll algorithm from 16 KiB up to the ring's
//    crossover, which grows with p (64-256 KiB at 16 ranks, 256 KiB-1 MiB at 64, above 1 MiB at
//    256); MPICH's selector took 6.1x its time at 64 KiB on 256 ranks. Above the crossover its
//    node-local stages cost more than it saves: 2(L-1)/L S at the node's shared-memory bandwidth
//    B_node, against the (L-1)/p S less that its inter-node stage puts on a node's link than a
//    ring in blocked rank order, so on bandwidth it wins only while B_node / B_link > N, the
//    node count (rule 6 for 2 nodes). Its lower bound is the crossover with halving-doubling in
//    the two-tier model (docs/algorithms.md): hierarchical pays (N-1-log2 N) more inter-node
//    latencies (the node-local ones left out: a fraction of alpha_link each) and saves
//    2(L-1)(N-1)/N S of a node link's bytes (halving-doubling's inter-node steps run all L ranks
//    of a node through its link at once), so it wins from S* = N (N-1-log2 N) alpha_link /
//    ((L-1)(N-1) beta_link). kLinkLatencyBytes stands for alpha_link / beta_link: 16 KiB (100
//    Gbit/s at about 1.25 us, a fat tree's mean hop in a ring over the nodes) halved, since on a
//    2:1 oversubscribed fabric halving-doubling's long-distance steps load the uplinks twice and
//    the crossover halves; on a full-bisection one that errs towards hierarchical, whose loss
//    below the crossover is bounded by its latency. S* is 5 KiB at 8 nodes of 8, 31 KiB at 32,
//    138 KiB at 128 (simulated at 1,024 ranks on the 2:1 tree: 64 KiB hierarchical 1.89x
//    halving-doubling's time, now halving-doubling; 256 KiB halving-doubling 1.54x hierarchical's).
//    With a slow node (Capabilities::slow_node_factor, from the probe: the fabric's median link
//    bandwidth over the slowest node's) every inter-node step waits for that node's link, so
//    beta_link is its beta: S* and rule 2's 8 KiB fall by the factor. One node's links 4x slower
//    on 8 nodes of 8 moves them to 1.3 and 2 KiB (simulated at 4 KiB: halving-doubling took 1.40x
//    hierarchical's time, all 8 ranks of the slow node crossing its link in each inter-node step).
// 4. Otherwise, up to 64 KiB, MPI's own allreduce when it is not oversubscribed: MPICH runs
//    small allreduces on shared-memory collectives that beat any algorithm built on
//    point-to-point messages (one MPI_Sendrecv of 4 KiB costs more than its whole 4 KiB
//    allreduce here); with ranks outnumbering cores those collectives busy-spin and take
//    seconds per call, so not then.
// 5. Recursive doubling up to 32 KiB (fewest steps).
// 6. On at most 2 nodes with the same number (> 1) of ranks each, or a node count not known
//    (zcoll.choose_algorithm without nodes): `hierarchical` at every size, which pays while
//    B_node / B_link > 2 (rule 3's bound for N = 2), unless the measured ratio
//    (Capabilities::node_link_ratio, from the probe every rank read) is known and below
//    kNodeLinkRatio: the simulated platform's 1.6 (20 / 12.5 GB/s) made hierarchical 1.08-1.18x
//    the ring's time on 2 nodes x 8 from 256 KiB. Not known, hierarchical stays: the 2 x 2 test
//    bed at 1 Gbit/s (shared memory tens of times the link) measured 1.58x the ring. Not on
//    nodes of different sizes: their extra ranks' fold is serial and one node of many extras can
//    cost more than the link saves (algorithm='hierarchical' still runs there).
// 7. A known topology (ZCOLL_TOPOLOGY, set_topology) whose best ring order has a slowest hop at
//    least kOrderedRingGain times faster than rank order's: `ordered_ring` (a ring's time is its
//    slowest hop's; below that gain, measurement noise may be all the difference).
// 8. The ring.
// A rule applies only where the communicator offers what its algorithm needs: those needs are
// the algorithm's descriptor's (algorithm_table.h: shm needs shared memory, mpi a native
// allreduce, which auto counts only when not oversubscribed, ordered_ring measured links); the
// rules add only their own conditions (sizes, equal nodes, the ring's gain).
#include <algorithm>
#include <cmath>
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
  int min_nodes = 0;                   // also at least this many nodes (0 nodes: unknown, fails); 0: any
  bool to_crossover = false;           // also below hierarchical_crossover; max_bytes / slow_node_factor
  double min_node_link_ratio = 0.0;    // also node_link_ratio unknown (0) or at least this; 0: any
};

constexpr std::size_t kAny = std::numeric_limits<std::size_t>::max();
constexpr int kAnyRanks = std::numeric_limits<int>::max();
constexpr double kOrderedRingGain = 1.25;
constexpr int kManyNodes = 3;  // from 3 nodes on, hierarchical only for its latency (rules 3, 6)
constexpr std::size_t kHierarchicalBytesPerRank = 4 * 1024;
constexpr double kNodeLinkRatio = 2.0;  // rule 6: B_node / B_link above the node count (2)
constexpr double kLinkLatencyBytes = 8 * 1024;  // alpha_link / beta_link on a 2:1 fabric, see rule 3

// Rule 3's lower bound: the size from which hierarchical's saved link bytes pay for its extra
// latency steps against halving-doubling, for caps.nodes equal nodes of ranks / nodes, costed at
// the slowest node's links; 0 when unknown.
double hierarchical_crossover(int ranks, const Capabilities& caps) {
  if (caps.nodes < 2 || ranks <= caps.nodes) return 0.0;
  const double N = caps.nodes, L = static_cast<double>(ranks) / caps.nodes;
  const double extra_steps = std::max(0.0, N - 1 - std::log2(N));
  const double link_latency_bytes = kLinkLatencyBytes / std::max(1.0, caps.slow_node_factor);
  return link_latency_bytes * N * extra_steps / ((L - 1) * (N - 1));
}

constexpr Rule kRules[] = {
    {kAnyRanks, kAny, false, 0.0, Algorithm::kShm},
    {kAnyRanks, 8 * 1024, true, 0.0, Algorithm::kHalvingDoubling, 0, 0, kManyNodes, true},
    {kAnyRanks, 8 * 1024, true, 0.0, Algorithm::kRecursiveDoubling, 0, kManyNodes - 1},
    {kAnyRanks, kAny, true, 0.0, Algorithm::kHierarchical, kHierarchicalBytesPerRank, 0, kManyNodes},
    {kAnyRanks, 64 * 1024, false, 0.0, Algorithm::kMpi},
    {kAnyRanks, 32 * 1024, false, 0.0, Algorithm::kRecursiveDoubling},
    {kAnyRanks, kAny, true, 0.0, Algorithm::kHierarchical, 0, kManyNodes - 1, 0, false, kNodeLinkRatio},
    {kAnyRanks, kAny, false, kOrderedRingGain, Algorithm::kOrderedRing},
    {kAnyRanks, kAny, false, 0.0, Algorithm::kRing},
};

bool matches(const Rule& rule, std::size_t bytes, int ranks, const Capabilities& caps, unsigned offered) {
  const unsigned needs = allreduce_algorithm(rule.algorithm).needs;
  const double slow_node = rule.to_crossover ? std::max(1.0, caps.slow_node_factor) : 1.0;
  const bool size_ok =
      static_cast<double>(bytes) <= static_cast<double>(rule.max_bytes) / slow_node ||
      (rule.to_crossover && static_cast<double>(bytes) < hierarchical_crossover(ranks, caps));
  return ranks <= rule.max_ranks && size_ok && (needs & ~offered) == 0 &&
         (caps.node_hierarchy || !rule.needs_node_hierarchy) &&
         caps.ordered_ring_gain >= rule.min_ordered_ring_gain &&
         (rule.max_bytes_per_rank == 0 || bytes <= rule.max_bytes_per_rank * static_cast<std::size_t>(ranks)) &&
         (rule.max_nodes == 0 || caps.nodes <= rule.max_nodes) && caps.nodes >= rule.min_nodes &&
         (caps.node_link_ratio <= 0.0 || caps.node_link_ratio >= rule.min_node_link_ratio);
}

}  // namespace

Algorithm choose_allreduce_algorithm(std::size_t bytes, int ranks, const Capabilities& caps) {
  const unsigned offered = offered_needs(caps);
  for (const Rule& rule : kRules)
    if (matches(rule, bytes, ranks, caps, offered)) return rule.algorithm;
  return Algorithm::kRing;
}

}  // namespace zcoll
