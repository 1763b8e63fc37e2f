#include "collectives/hierarchy.h"

#include <algorithm>

#include "collectives/options.h"
#include "common/check.h"

namespace zcoll::detail {

NodeGrid::NodeGrid(const Communicator& comm)
    : nodes_(comm.node_count()), local_size_(comm.ranks_per_node()) {
  ZCOLL_CHECK_LT(0, local_size_, "NodeGrid needs nodes of equal size");
  rank_at_.assign(static_cast<std::size_t>(nodes_) * local_size_, -1);
  std::vector<int> seen(nodes_, 0);  // ranks of each node met so far
  for (int r = 0; r < comm.size(); ++r) {
    const int n = comm.node_of(r), l = seen[n]++;
    rank_at_[static_cast<std::size_t>(n) * local_size_ + l] = r;
    if (r == comm.rank()) node_ = n, local_ = l;
  }
}

std::string node_sizes(const Communicator& comm) {
  std::vector<int> sizes(comm.node_count(), 0);
  for (int r = 0; r < comm.size(); ++r) ++sizes[comm.node_of(r)];
  std::string out;
  for (int s : sizes) out += (out.empty() ? "" : ", ") + std::to_string(s);
  return out;
}

HierLayout::HierLayout(std::size_t count, std::size_t granule, int local_size, int nodes, std::size_t chunk_elems)
    : count_(count), granule_(granule), granules_((count + granule - 1) / granule), L_(local_size), N_(nodes) {
  const std::size_t chunk_granules = std::max<std::size_t>(1, chunk_elems / granule);
  const std::size_t per_block = chunk_granules * static_cast<std::size_t>(L_) * static_cast<std::size_t>(N_);
  nblk_ = std::max<std::size_t>(1, (granules_ + per_block - 1) / per_block);
}

Range HierLayout::elements(Range g) const {
  const std::size_t begin = std::min(count_, g.begin * granule_);
  return Range{begin, std::min(count_, (g.begin + g.count) * granule_) - begin};
}

// split() makes parts of floor or ceil(whole / parts) elements.
namespace {
std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }
}  // namespace

std::size_t HierLayout::max_shard_elems() const {
  return ceil_div(ceil_div(granules_, nblk_), static_cast<std::size_t>(L_)) * granule_;
}
std::size_t HierLayout::max_chunk_elems() const {
  return ceil_div(max_shard_elems() / granule_, static_cast<std::size_t>(N_)) * granule_;
}

}  // namespace zcoll::detail
