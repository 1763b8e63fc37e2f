// What zcoll knows about the links between a communicator's ranks, and the ring order it derives
// from them (the topology-ordered ring, docs/algorithms.md).
//
// The input is a bandwidth matrix bw (p x p, row-major, bytes/s; bw[i * p + j]: i sends to j;
// the diagonal is ignored), as `zcoll probe` measures it (python/zcoll/probe.py). A ring's time is
// set by its slowest hop, so the order kept is the one whose slowest hop is fastest (then whose
// summed hop time is smallest), as zcoll.topology.best_cycle does in Python:
//   p <= 8   every order starting at rank 0 ((p-1)! <= 5040 of them, each costed in p steps);
//   p > 8    the better of rank order and a greedy chain (from rank 0, always to the unvisited
//            rank with the fastest link), then improved by reversing segments and swapping pairs
//            while that helps (whole passes, at most kImprovePasses of them, up to 256 ranks).
// The search is deterministic: every rank given the same matrix derives the same order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zcoll {

struct Topology {
  std::vector<int> ring;    // ring[k] sends to ring[(k+1) % p], ring[0] == 0; empty: none known
  double ring_gain = 1.0;   // slowest hop of the rank-order ring / slowest hop of `ring` (time, >= 1)
  std::uint64_t fingerprint = 0;  // of `ring` (FNV-1a), for check mode; 0 when none
  double node_link_ratio = 0.0;   // node_link_ratio() of the measured matrix; 0: not known
  double slow_node_factor = 0.0;  // slow_node_factor() of the measured matrix; 0: not known
  bool known() const { return !ring.empty(); }
};

// (slowest hop, summed hops) of the ring `order` over bw, in seconds per byte.
struct RingCost {
  double slowest = 0.0;
  double total = 0.0;
};
RingCost ring_cost(const std::vector<double>& bw, int p, const std::vector<int>& order);

// The order described above. Throws std::invalid_argument for a matrix of the wrong size or with
// an off-diagonal entry that is not a positive finite number.
std::vector<int> best_ring_order(const std::vector<double>& bw, int p);

// The median bandwidth between ranks of one node over the median between ranks of different
// nodes (node_of[r]: rank r's node), for `auto` (rule 6: hierarchical on 2 nodes pays only while
// this is at least 2). Medians, so one slow pair does not decide it; 0 when either tier has no
// pair. A pure function of the matrix and the placement, so every rank given the same probe
// computes the same ratio and makes the same choice.
double node_link_ratio(const std::vector<double>& bw, int p, const std::vector<int>& node_of);
// How many times slower the slowest node's links are than the fabric's: the median bandwidth
// between ranks of different nodes over the slowest node's median (each node's over the pairs
// with one end on it, both directions), >= 1. Every algorithm waits for that node, so `auto`
// costs the inter-node bytes at its links' bandwidth (rule 3's crossover). Medians, so a single
// slow route (one pair) does not make a slow node; 0 with fewer than 3 nodes (two nodes share
// every inter-node pair: no node stands out) or no pair across. A pure function of the matrix
// and the placement.
double slow_node_factor(const std::vector<double>& bw, int p, const std::vector<int>& node_of);
Topology topology_from_bandwidth(const std::vector<double>& bw, int p);

// The parts of a probe result (`zcoll probe`'s probe.json, format zcoll-probe/1) zcoll uses:
// its world size, the node of every world rank and the bandwidth matrix (NaN on the diagonal).
struct ProbeFile {
  int size = 0;
  std::vector<int> node_of;
  std::vector<double> bandwidth;
};
// Throws std::invalid_argument naming the path and what is wrong with it.
ProbeFile read_probe_file(const std::string& path);

// The topology of a communicator whose rank r is world rank world_rank[r] and on node node_of[r],
// from a probe of the whole world (world_size ranks): its bandwidth matrix restricted to these
// ranks. Throws std::invalid_argument when the probe measured another world size or grouped these
// ranks into nodes differently (a probe of another placement).
Topology topology_from_probe(const ProbeFile& probe, const std::string& path, int world_size,
                             const std::vector<int>& world_rank, const std::vector<int>& node_of);

}  // namespace zcoll
