// The hierarchical allreduce and the topology-ordered ring over thread-ranks placed on nodes
// (InProcOptions::nodes) and given link bandwidths (InProcOptions::bandwidth): every case of the
// allreduce matrix (cases.h) against the references, bitwise identical on every rank, on node
// layouts of 1..8 ranks (blocked, interleaved, one rank per node, one node) and on unequal
// nodes (extras folded); the ring order's search against brute force; what `auto` picks.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "cases.h"
#include "collectives/options.h"
#include "comm/topology.h"
#include "common/error.h"
#include "reference.h"
#include "ztest.h"

using zcoll::Algorithm;
using zcoll::Communicator;
using zcoll::DType;

namespace {

struct Layout {
  std::vector<int> nodes;  // node label per rank
  bool arena = true;       // offer shared memory (used on one node only)
};

// Blocked (0,0,1,1), interleaved (0,1,0,1), one rank per node, one node; every equal split of
// 1..8 ranks.
std::vector<Layout> equal_layouts() {
  std::vector<Layout> out;
  for (int p = 1; p <= 8; ++p)
    for (int L = 1; L <= p; ++L) {
      if (p % L) continue;
      const int N = p / L;
      Layout blocked, interleaved;
      for (int r = 0; r < p; ++r) {
        blocked.nodes.push_back(r / L);
        interleaved.nodes.push_back(r % N);
      }
      out.push_back(blocked);
      if (interleaved.nodes != blocked.nodes) out.push_back(interleaved);
    }
  out.push_back({{0, 0, 0}, false});  // one node without shared memory: the node-local ring alone
  return out;
}

std::string describe(const std::vector<int>& nodes) {
  std::string s;
  for (int n : nodes) s += (s.empty() ? "" : ",") + std::to_string(n);
  return s;
}

zcoll::InProcOptions with_nodes(const Layout& layout) {
  zcoll::InProcOptions o = ztest::test_options();
  o.nodes = layout.nodes;
  o.shared_arena = layout.arena;
  return o;
}

// Link bandwidths around 1e9 bytes/s that differ per directed pair (deterministic).
std::vector<double> varied_bandwidth(int p, std::uint64_t salt) {
  std::vector<double> bw(static_cast<std::size_t>(p) * p, 0.0);
  for (int i = 0; i < p; ++i)
    for (int j = 0; j < p; ++j)
      if (i != j) bw[static_cast<std::size_t>(i) * p + j] = 1e9 * (0.2 + ref::uniform(i, static_cast<std::size_t>(j), p, salt));
  return bw;
}

// Every cycle through 0: the best slowest hop (seconds per byte), by brute force.
double brute_force_slowest(const std::vector<double>& bw, int p) {
  std::vector<int> order(p);
  std::iota(order.begin(), order.end(), 0);
  double best = HUGE_VAL;
  do best = std::min(best, zcoll::ring_cost(bw, p, order).slowest);
  while (std::next_permutation(order.begin() + 1, order.end()));
  return best;
}

bool is_permutation_from_zero(const std::vector<int>& order, int p) {
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> identity(p);
  std::iota(identity.begin(), identity.end(), 0);
  return sorted == identity && !order.empty() && order[0] == 0;
}

}  // namespace

TEST(hierarchical, every_case_on_every_equal_layout) {
  for (const Layout& layout : equal_layouts()) {
    const int p = static_cast<int>(layout.nodes.size());
    ztest::Context ctx(ztest::str("nodes ", describe(layout.nodes), layout.arena ? "" : " without shm"));
    cases::run_and_check(p, cases::allreduce_cases(Algorithm::kHierarchical, p), with_nodes(layout));
  }
}

// Nodes of different sizes: the ranks beyond the smallest node's size fold into the others
// (blocked and interleaved placements, extras folding into one core rank or several).
TEST(hierarchical, unequal_nodes_fold) {
  const std::vector<std::vector<int>> layouts = {{0, 0, 0, 1}, {0, 1, 1}, {0, 1, 2, 2, 2},
                                                 {0, 1, 0, 0, 1, 0, 0}, {1, 1, 1, 1, 1, 0, 0}};
  for (const std::vector<int>& nodes : layouts) {
    const int p = static_cast<int>(nodes.size());
    ztest::Context ctx(ztest::str("nodes ", describe(nodes)));
    cases::run_and_check(p, cases::allreduce_cases(Algorithm::kHierarchical, p), with_nodes({nodes}));
  }
}

// auto: hierarchical across equal nodes of several ranks (above the small-message rules), not
// on unequal nodes, with one rank per node nor on one node.
TEST(hierarchical, auto_picks_it_across_nodes) {
  struct Want {
    std::vector<int> nodes;
    std::size_t count;
    Algorithm algorithm;
  };
  const Want wants[] = {{{0, 0, 1, 1}, 1 << 18, Algorithm::kHierarchical},
                        {{0, 1, 0, 1, 0, 1}, 1 << 16, Algorithm::kHierarchical},
                        {{0, 0, 1, 1}, 256, Algorithm::kRecursiveDoubling},
                        {{0, 1, 2, 3}, 1 << 18, Algorithm::kRing},
                        {{0, 0, 0, 1}, 1 << 18, Algorithm::kRing},  // unequal: named only
                        {{0, 0, 0, 0}, 1 << 18, Algorithm::kShm}};
  for (const Want& w : wants) {
    const int p = static_cast<int>(w.nodes.size());
    ztest::Context ctx(ztest::str("nodes ", describe(w.nodes), " count ", w.count));
    ON_RANKS(p, with_nodes({w.nodes}), [&](Communicator& comm) {
      std::vector<float> x(w.count, 1.0f), y(w.count);
      CHECK_EQ(zcoll::algorithm_name(zcoll::allreduce(comm, x.data(), y.data(), w.count, DType::kFloat32)),
               std::string(zcoll::algorithm_name(w.algorithm)));
      CHECK_EQ(y[w.count - 1], static_cast<float>(p));
    });
  }
}

// The search: p <= 8 finds the best slowest hop (brute force over every cycle agrees); above,
// the order is a permutation starting at 0 and no worse than rank order.
TEST(topology, best_ring_order_against_brute_force) {
  for (int p = 1; p <= 8; ++p)
    for (std::uint64_t salt = 0; salt < 4; ++salt) {
      const std::vector<double> bw = varied_bandwidth(p, salt);
      const std::vector<int> order = zcoll::best_ring_order(bw, p);
      ztest::Context ctx(ztest::str("p=", p, " salt ", salt));
      CHECK(is_permutation_from_zero(order, p));
      if (p > 1) CHECK_LE(zcoll::ring_cost(bw, p, order).slowest, brute_force_slowest(bw, p) * 1.001);
    }
  for (int p : {9, 16, 40}) {
    const std::vector<double> bw = varied_bandwidth(p, 7);
    const std::vector<int> order = zcoll::best_ring_order(bw, p);
    std::vector<int> identity(p);
    std::iota(identity.begin(), identity.end(), 0);
    ztest::Context ctx(ztest::str("p=", p));
    CHECK(is_permutation_from_zero(order, p));
    CHECK_LE(zcoll::ring_cost(bw, p, order).slowest, zcoll::ring_cost(bw, p, identity).slowest);
  }
}

// One directed link at 1/4 of the others' rate: the ring avoids it and is 4x faster on paper;
// the same matrix on every rank gives the same order; bad matrices are refused.
TEST(topology, slow_link_avoided) {
  for (int p : {3, 4, 6, 12}) {
    for (int slow_from : {0, p - 1}) {
      std::vector<double> bw(static_cast<std::size_t>(p) * p, 125e6);
      const int slow_to = (slow_from + 1) % p;  // a hop of the rank-order ring
      bw[static_cast<std::size_t>(slow_from) * p + slow_to] = 125e6 / 4;
      const zcoll::Topology t = zcoll::topology_from_bandwidth(bw, p);
      ztest::Context ctx(ztest::str("p=", p, " slow ", slow_from, "->", slow_to));
      for (int k = 0; k < p; ++k) CHECK(!(t.ring[k] == slow_from && t.ring[(k + 1) % p] == slow_to));
      CHECK(std::fabs(t.ring_gain - 4.0) < 1e-9);
      CHECK_NE(t.fingerprint, 0u);
    }
  }
  std::vector<double> bad(16, 1e9);
  bad[1] = 0.0;
  CHECK_THROWS(zcoll::best_ring_order(bad, 4), std::invalid_argument);
  CHECK_THROWS(zcoll::best_ring_order(std::vector<double>(15, 1e9), 4), std::invalid_argument);
}

// The node/link bandwidth ratio rule 6 reads: medians of each tier, so one slow pair does not
// move it; 0 (unknown) where a tier has no pair.
TEST(topology, node_link_ratio) {
  const int p = 4;
  const std::vector<int> two_nodes = {0, 0, 1, 1};
  std::vector<double> bw(static_cast<std::size_t>(p) * p, 0.0);
  for (int i = 0; i < p; ++i)
    for (int j = 0; j < p; ++j) bw[static_cast<std::size_t>(i) * p + j] = two_nodes[i] == two_nodes[j] ? 20e9 : 12.5e9;
  CHECK(std::fabs(zcoll::node_link_ratio(bw, p, two_nodes) - 1.6) < 1e-12);
  bw[0 * p + 2] = 1e9;  // one slow pair of 8 across: the median stays 12.5 GB/s
  CHECK(std::fabs(zcoll::node_link_ratio(bw, p, two_nodes) - 1.6) < 1e-12);
  bw[0 * p + 1] = 60e9;  // within: 60, 20, 20, 20 -> median 20
  CHECK(std::fabs(zcoll::node_link_ratio(bw, p, two_nodes) - 1.6) < 1e-12);
  bw[1 * p + 0] = 60e9;  // 60, 60, 20, 20 -> median 40
  CHECK(std::fabs(zcoll::node_link_ratio(bw, p, two_nodes) - 3.2) < 1e-12);
  CHECK_EQ(zcoll::node_link_ratio(bw, p, {0, 1, 2, 3}), 0.0);  // no pair within a node
  CHECK_EQ(zcoll::node_link_ratio(bw, p, {0, 0, 0, 0}), 0.0);  // no pair across
  CHECK_THROWS(zcoll::node_link_ratio(bw, p, {0, 0, 1}), std::invalid_argument);
}

// The slow node auto reads (rules 2-3): the median across nodes over the slowest node's median
// of the pairs touching it; one slow route is no slow node; 0 below 3 nodes.
TEST(topology, slow_node_factor) {
  const int p = 10;
  std::vector<int> five_nodes(p);
  for (int r = 0; r < p; ++r) five_nodes[r] = r / 2;
  std::vector<double> bw(static_cast<std::size_t>(p) * p, 0.0);
  for (int i = 0; i < p; ++i)
    for (int j = 0; j < p; ++j)
      bw[static_cast<std::size_t>(i) * p + j] = five_nodes[i] == five_nodes[j] ? 20e9 : 12.5e9;
  CHECK_EQ(zcoll::slow_node_factor(bw, p, five_nodes), 1.0);
  bw[0 * p + 2] = 1e9;  // one slow pair: every node's median stays 12.5 GB/s
  CHECK_EQ(zcoll::slow_node_factor(bw, p, five_nodes), 1.0);
  for (int i = 0; i < p; ++i)  // node 1 (ranks 2, 3): its 32 of the 80 pairs across at 1/4
    for (int j = 0; j < p; ++j)
      if (five_nodes[i] != five_nodes[j] && (five_nodes[i] == 1 || five_nodes[j] == 1))
        bw[static_cast<std::size_t>(i) * p + j] = 12.5e9 / 4;
  CHECK(std::fabs(zcoll::slow_node_factor(bw, p, five_nodes) - 4.0) < 1e-12);
  CHECK_EQ(zcoll::slow_node_factor(bw, p, {0, 0, 0, 0, 0, 1, 1, 1, 1, 1}), 0.0);  // two nodes
  CHECK_EQ(zcoll::slow_node_factor(bw, p, std::vector<int>(p, 0)), 0.0);          // one node
  CHECK_THROWS(zcoll::slow_node_factor(bw, p, {0, 1, 2}), std::invalid_argument);
}

TEST(ordered_ring, every_case_with_a_topology) {
  for (int p = 1; p <= 8; ++p) {
    zcoll::InProcOptions o = ztest::test_options();
    o.bandwidth = varied_bandwidth(p, 3);
    ztest::Context ctx(ztest::str("p=", p));
    cases::run_and_check(p, cases::allreduce_cases(Algorithm::kOrderedRing, p), o);
  }
}

// Without a topology it is refused (whatever the count); auto takes it only when the ordered
// ring's slowest hop is clearly faster than rank order's (ring_gain >= 1.25).
TEST(ordered_ring, refused_without_topology_and_auto) {
  ON_RANKS(4, ztest::test_options(), [&](Communicator& comm) {
    std::vector<float> x(8, 1.0f), y(8);
    zcoll::AllreduceOptions o;
    o.algorithm = Algorithm::kOrderedRing;
    CHECK_THROWS(zcoll::allreduce(comm, x.data(), y.data(), 0, DType::kFloat32, o), std::invalid_argument);
    CHECK_THROWS(zcoll::allreduce(comm, x.data(), y.data(), 8, DType::kFloat32, o), std::invalid_argument);
  });
  for (double slow : {125e6 / 4, 125e6 * 0.9}) {
    zcoll::InProcOptions o = ztest::test_options();
    o.shared_arena = false;  // else shm wins
    o.bandwidth.assign(16, 125e6);
    o.bandwidth[0 * 4 + 1] = slow;
    const Algorithm want = slow < 100e6 ? Algorithm::kOrderedRing : Algorithm::kRing;
    ON_RANKS(4, o, [&](Communicator& comm) {
      std::vector<float> x(1 << 18, 1.0f), y(1 << 18);
      CHECK_EQ(zcoll::algorithm_name(zcoll::allreduce(comm, x.data(), y.data(), x.size(), DType::kFloat32)),
               std::string(zcoll::algorithm_name(want)));
      CHECK_EQ(y.back(), 4.0f);
    });
  }
}

// Check mode compares the ring order: ranks holding different topologies all raise.
TEST(ordered_ring, check_mode_catches_different_orders) {
  ON_RANKS(4, ztest::test_options(), [&](Communicator& comm) {
    std::vector<double> bw(16, 1e9);
    if (comm.rank() == 2) bw[0 * 4 + 1] = 1e8;  // rank 2 believes 0->1 is slow
    comm.set_topology(zcoll::topology_from_bandwidth(bw, 4));
    std::vector<float> x(64, 1.0f), y(64);
    zcoll::AllreduceOptions o;
    o.algorithm = Algorithm::kOrderedRing;
    o.check_args = true;
    try {
      zcoll::allreduce(comm, x.data(), y.data(), x.size(), DType::kFloat32, o);
      FAIL_CHECK("no MismatchError");
    } catch (const zcoll::MismatchError& e) {
      CHECK(std::string(e.what()).find("ring order") != std::string::npos);
    }
  });
}
