#include "comm/topology.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "common/check.h"

namespace zcoll {
namespace {

constexpr int kExactUpTo = 8;
constexpr int kImproveUpTo = 256;
constexpr int kImprovePasses = 50;

// The median of v (reordered), the mean of the two middle values for an even count.
double median(std::vector<double>& v) {
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return 0.5 * (upper + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)));
}

double hop_time(const std::vector<double>& bw, int p, int from, int to) {
  return 1.0 / bw[static_cast<std::size_t>(from) * p + to];
}

// a beats b: a clearly (> 0.1%) faster slowest hop, or about equal and a clearly smaller sum
// (zcoll.topology._better: measured matrices carry noise well above 0.1%).
bool better(const RingCost& a, const RingCost& b) {
  if (a.slowest < b.slowest * 0.999) return true;
  return a.slowest <= b.slowest * 1.001 && a.total < b.total * 0.999;
}

void validate(const std::vector<double>& bw, int p) {
  ZCOLL_REQUIRE(p >= 1, "topology: ", p, " ranks");
  ZCOLL_REQUIRE(bw.size() == static_cast<std::size_t>(p) * p, "topology: a bandwidth matrix for ", p,
                " ranks has ", p * p, " entries, not ", bw.size());
  for (int i = 0; i < p; ++i)
    for (int j = 0; j < p; ++j) {
      const double v = bw[static_cast<std::size_t>(i) * p + j];
      ZCOLL_REQUIRE(i == j || (std::isfinite(v) && v > 0), "topology: bandwidth from rank ", i, " to rank ", j,
                    " is ", v, "; every link needs a positive finite bandwidth (bytes/s)");
    }
}

std::vector<int> greedy_chain(const std::vector<double>& bw, int p) {
  std::vector<int> order{0};
  std::vector<bool> used(p, false);
  used[0] = true;
  for (int k = 1; k < p; ++k) {
    const int from = order.back();
    int best = -1;
    for (int r = 0; r < p; ++r)
      if (!used[r] && (best < 0 || bw[static_cast<std::size_t>(from) * p + r] > bw[static_cast<std::size_t>(from) * p + best]))
        best = r;
    used[best] = true;
    order.push_back(best);
  }
  return order;
}

// Segment reversals and pair swaps (position 0 stays rank 0), whole passes while one helps.
void improve(const std::vector<double>& bw, int p, std::vector<int>& order) {
  RingCost cost = ring_cost(bw, p, order);
  auto try_move = [&](auto&& apply) {
    apply();
    const RingCost c = ring_cost(bw, p, order);
    if (better(c, cost)) {
      cost = c;
      return true;
    }
    apply();  // both moves are their own inverse
    return false;
  };
  for (int pass = 0; pass < kImprovePasses; ++pass) {
    bool improved = false;
    for (int i = 1; i < p; ++i)
      for (int j = i + 1; j < p; ++j) {
        improved |= try_move([&] { std::reverse(order.begin() + i, order.begin() + j + 1); });
        improved |= try_move([&] { std::swap(order[i], order[j]); });
      }
    if (!improved) break;
  }
}

std::uint64_t fnv1a(const std::vector<int>& v) {
  std::uint64_t h = 1469598103934665603ull;
  for (int x : v)
    for (int b = 0; b < 4; ++b) {
      h ^= static_cast<std::uint64_t>((static_cast<unsigned>(x) >> (8 * b)) & 0xff);
      h *= 1099511628211ull;
    }
  return h;
}

// --- a reader for the few fields of probe.json zcoll needs ---------------------------------------
class JsonReader {
 public:
  JsonReader(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  // Calls on_key(key) for each key of the top-level object, positioned at its value; on_key
  // returns false to have the value skipped.
  template <typename OnKey>
  void object(OnKey on_key) {
    expect('{');
    if (take('}')) return;
    do {
      const std::string key = string();
      expect(':');
      if (!on_key(key)) skip();
    } while (take(','));
    expect('}');
  }

  std::string string() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') ++i_;  // escapes: only their presence matters here
      if (i_ < s_.size()) out += s_[i_++];
    }
    expect('"');
    return out;
  }

  double number_or_null() {
    ws();
    if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
      return std::numeric_limits<double>::quiet_NaN();
    }
    const char* begin = s_.c_str() + i_;
    char* end = nullptr;
    const double v = std::strtod(begin, &end);
    if (end == begin) fail("a number");
    i_ += static_cast<std::size_t>(end - begin);
    return v;
  }

  template <typename Item>
  void array(Item item) {
    expect('[');
    if (take(']')) return;
    do item();
    while (take(','));
    expect(']');
  }

  void skip() {
    ws();
    if (i_ >= s_.size()) fail("a value");
    const char c = s_[i_];
    if (c == '{') {
      object([](const std::string&) { return false; });
    } else if (c == '[') {
      array([&] { skip(); });
    } else if (c == '"') {
      string();
    } else if (s_.compare(i_, 4, "true") == 0 || s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
    } else if (s_.compare(i_, 5, "false") == 0) {
      i_ += 5;
    } else {
      number_or_null();
    }
  }

  [[noreturn]] void fail(const char* what) const {
    throw std::invalid_argument(detail::concat("ZCOLL_TOPOLOGY: ", path_, " is not a zcoll probe result: expected ",
                                               what, " at byte ", i_));
  }

 private:
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool take(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) {
      const char what[] = {'\'', c, '\'', '\0'};
      fail(what);
    }
  }

  const std::string& s_;
  const std::string& path_;
  std::size_t i_ = 0;
};

}  // namespace

RingCost ring_cost(const std::vector<double>& bw, int p, const std::vector<int>& order) {
  RingCost c;
  for (int k = 0; k < p && p > 1; ++k) {
    const double t = hop_time(bw, p, order[k], order[(k + 1) % p]);
    c.slowest = std::max(c.slowest, t);
    c.total += t;
  }
  return c;
}

std::vector<int> best_ring_order(const std::vector<double>& bw, int p) {
  validate(bw, p);
  std::vector<int> order(p);
  std::iota(order.begin(), order.end(), 0);
  if (p <= 2) return order;  // one cycle
  std::vector<int> best = order;
  RingCost best_cost = ring_cost(bw, p, best);
  if (p <= kExactUpTo) {
    while (std::next_permutation(order.begin() + 1, order.end())) {
      const RingCost c = ring_cost(bw, p, order);
      if (better(c, best_cost)) best = order, best_cost = c;
    }
    return best;
  }
  std::vector<int> greedy = greedy_chain(bw, p);
  if (better(ring_cost(bw, p, greedy), best_cost)) best = greedy;
  if (p <= kImproveUpTo) improve(bw, p, best);
  return best;
}

double node_link_ratio(const std::vector<double>& bw, int p, const std::vector<int>& node_of) {
  ZCOLL_REQUIRE(node_of.size() == static_cast<std::size_t>(p), "node_link_ratio: ", node_of.size(), " nodes for ", p,
                " ranks");
  std::vector<double> node, link;
  for (int i = 0; i < p; ++i)
    for (int j = 0; j < p; ++j)
      if (i != j) (node_of[i] == node_of[j] ? node : link).push_back(bw[static_cast<std::size_t>(i) * p + j]);
  if (node.empty() || link.empty()) return 0.0;
  const double on_link = median(link);
  return on_link > 0 ? median(node) / on_link : 0.0;
}

double slow_node_factor(const std::vector<double>& bw, int p, const std::vector<int>& node_of) {
  ZCOLL_REQUIRE(node_of.size() == static_cast<std::size_t>(p), "slow_node_factor: ", node_of.size(),
                " nodes for ", p, " ranks");
  const int nodes = node_of.empty() ? 0 : *std::max_element(node_of.begin(), node_of.end()) + 1;
  if (nodes < 3) return 0.0;
  std::vector<std::vector<double>> touching(static_cast<std::size_t>(nodes));
  std::vector<double> link;
  for (int i = 0; i < p; ++i)
    for (int j = 0; j < p; ++j)
      if (node_of[i] != node_of[j]) {
        const double b = bw[static_cast<std::size_t>(i) * p + j];
        link.push_back(b);
        touching[node_of[i]].push_back(b);
        touching[node_of[j]].push_back(b);
      }
  if (link.empty()) return 0.0;
  double slowest = std::numeric_limits<double>::infinity();
  for (auto& pairs : touching)
    if (!pairs.empty()) slowest = std::min(slowest, median(pairs));
  return slowest > 0 ? std::max(1.0, median(link) / slowest) : 0.0;
}

Topology topology_from_bandwidth(const std::vector<double>& bw, int p) {
  Topology t;
  t.ring = best_ring_order(bw, p);
  std::vector<int> identity(p);
  std::iota(identity.begin(), identity.end(), 0);
  const RingCost mine = ring_cost(bw, p, t.ring), plain = ring_cost(bw, p, identity);
  t.ring_gain = mine.slowest > 0 ? plain.slowest / mine.slowest : 1.0;
  t.fingerprint = fnv1a(t.ring);
  return t;
}

ProbeFile read_probe_file(const std::string& path) {
  std::ifstream in(path);
  ZCOLL_REQUIRE(in.good(), "ZCOLL_TOPOLOGY: cannot read '", path, "' (give the probe.json `zcoll probe` wrote)");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  JsonReader json(text, path);
  ProbeFile probe;
  std::string format;
  std::size_t rows = 0;
  json.object([&](const std::string& key) {
    if (key == "format") {
      format = json.string();
    } else if (key == "size") {
      probe.size = static_cast<int>(json.number_or_null());
    } else if (key == "node_of") {
      json.array([&] { probe.node_of.push_back(static_cast<int>(json.number_or_null())); });
    } else if (key == "bandwidth_bytes_per_s") {
      json.array([&] {
        ++rows;
        json.array([&] { probe.bandwidth.push_back(json.number_or_null()); });
      });
    } else {
      return false;
    }
    return true;
  });
  ZCOLL_REQUIRE(format == "zcoll-probe/1", "ZCOLL_TOPOLOGY: ", path, " has format '", format,
                "', expected 'zcoll-probe/1' (the probe.json of `zcoll probe`)");
  const auto p = static_cast<std::size_t>(probe.size);
  ZCOLL_REQUIRE(probe.size >= 1 && probe.node_of.size() == p && rows == p && probe.bandwidth.size() == p * p,
                "ZCOLL_TOPOLOGY: ", path, " is inconsistent: size ", probe.size, ", ", probe.node_of.size(),
                " node_of entries, a ", rows, "-row bandwidth matrix of ", probe.bandwidth.size(), " entries");
  return probe;
}

Topology topology_from_probe(const ProbeFile& probe, const std::string& path, int world_size,
                             const std::vector<int>& world_rank, const std::vector<int>& node_of) {
  const int p = static_cast<int>(world_rank.size());
  ZCOLL_REQUIRE(probe.size == world_size, "ZCOLL_TOPOLOGY: ", path, " measured ", probe.size,
                " ranks, this job has ", world_size, " (probe the job's whole world, as launched)");
  for (int r = 0; r < p; ++r) ZCOLL_CHECK_LT(world_rank[r], probe.size, "world rank");
  std::vector<double> bw(static_cast<std::size_t>(p) * p);
  for (int i = 0; i < p; ++i)
    for (int j = 0; j < p; ++j) {
      const int wi = world_rank[i], wj = world_rank[j];
      ZCOLL_REQUIRE((probe.node_of[wi] == probe.node_of[wj]) == (node_of[i] == node_of[j]), "ZCOLL_TOPOLOGY: ",
                    path, " puts world ranks ", wi, " and ", wj, (probe.node_of[wi] == probe.node_of[wj] ? " on one node" : " on different nodes"),
                    ", this job does not: it was measured with another placement; probe again");
      bw[static_cast<std::size_t>(i) * p + j] = i == j ? 0.0 : probe.bandwidth[static_cast<std::size_t>(wi) * probe.size + wj];
    }
  Topology topology = topology_from_bandwidth(bw, p);
  topology.node_link_ratio = node_link_ratio(bw, p, node_of);
  topology.slow_node_factor = slow_node_factor(bw, p, node_of);
  return topology;
}

}  // namespace zcoll
