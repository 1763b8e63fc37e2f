// The engine-side communicator (communicator.h): the transport's capabilities read once, the
// components it composes, and the node map.
#include "comm/communicator.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "common/check.h"
#include "comm/dump.h"
#include "common/env.h"

namespace zcoll {

Communicator::Communicator(std::unique_ptr<Transport> transport)
    : transport_(std::move(transport)),
      monitor_(transport_->monitor()),
      native_(transport_->native_allreduce()),
      shared_memory_(transport_->shared_memory()),
      rank_(transport_->rank()),
      size_(transport_->size()),
      watchdog_(*this),
      recorder_(static_cast<std::size_t>(env::get_int(env::Var::kFlightRecorder))),
      telemetry_(env::get_bool(env::Var::kTelemetry)) {
  transport_->attach(watchdog_);
  watchdog_.on_failure = [this](const std::string& what) { return dump_communicator(*this, what); };
}

// Unregistered first: a dump running on another thread never sees a communicator being torn down.
Communicator::~Communicator() { detail::unregister_for_dumps(this); }

void Communicator::set_identity(const std::string& id) {
  id_ = id;
  id_rank_ = rank_;
  id_size_ = size_;
  telemetry_.resize(size_);
  detail::register_for_dumps(this);
}

void Communicator::native_allreduce(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) {
  if (!native_) throw std::invalid_argument("algorithm 'mpi' needs an MPI communicator");
  native_->allreduce(in, out, count, dtype, op);
  // What a ring would send, so that "mpi" rows compare with the others'.
  stats_.bytes_sent += 2 * count * dtype_size(dtype) * static_cast<std::size_t>(size_ - 1) / size_;
}

void* Communicator::scratch(std::size_t bytes, Scratch purpose) {
  auto& buf = scratch_[static_cast<int>(purpose)];
  if (buf.size() < bytes) {
    buf.clear();
    buf.shrink_to_fit();
    buf.resize(bytes);
  }
  return buf.data();
}

int Communicator::node_of(int rank) const {
  ZCOLL_REQUIRE(rank >= 0 && rank < size(), "node_of: rank ", rank, " is not in 0..", size() - 1);
  return node_of_.empty() ? 0 : node_of_[rank];
}

std::vector<int> Communicator::local_ranks() const {
  std::vector<int> out;
  const int mine = node_of(rank());
  for (int r = 0; r < size(); ++r)
    if (node_of(r) == mine) out.push_back(r);
  return out;
}

int Communicator::ranks_per_node() const { return node_of_.empty() ? size() : ranks_per_node_; }

void Communicator::set_topology(Topology topology) {
  const std::size_t p = static_cast<std::size_t>(size());
  if (topology.known()) {
    std::vector<bool> seen(p, false);
    ZCOLL_REQUIRE(topology.ring.size() == p, "set_topology: a ring of ", topology.ring.size(), " ranks for ", p);
    for (int r : topology.ring) {
      ZCOLL_REQUIRE(r >= 0 && static_cast<std::size_t>(r) < p && !seen[r], "set_topology: the ring order is not a permutation of 0..", p - 1);
      seen[r] = true;
    }
  }
  topology_ = std::move(topology);
}

void Communicator::set_nodes(const std::vector<int>& labels) {
  ZCOLL_CHECK_EQ(labels.size(), static_cast<std::size_t>(size()), "one node label per rank");
  std::map<int, int> number;  // label -> node, in order of first appearance
  node_of_.clear();
  for (int label : labels) {
    const int next = static_cast<int>(number.size());
    node_of_.push_back(number.emplace(label, next).first->second);
  }
  node_count_ = static_cast<int>(number.size());
  std::vector<int> per_node(node_count_, 0);
  for (int node : node_of_) ++per_node[node];
  const bool equal = std::all_of(per_node.begin(), per_node.end(), [&](int n) { return n == per_node[0]; });
  ranks_per_node_ = equal ? per_node[0] : 0;
}

}  // namespace zcoll
