#include "collectives/hierarchy.h"

#include <algorithm>

#include "collectives/options.h"
#include "common/check.h"

namespace zcoll::detail {

NodeGrid::NodeGrid(const Communicator& comm) : nodes_(comm.node_count()) {
  std::vector<std::vector<int>> members(nodes_);  // each node's ranks, ascending
  for (int r = 0; r < comm.size(); ++r) members[comm.node_of(r)].push_back(r);
  local_size_ = static_cast<int>(members[0].size());
  for (const auto& m : members) {
    equal_ = equal_ && static_cast<int>(m.size()) == local_size_;
    local_size_ = std::min(local_size_, static_cast<int>(m.size()));
  }
  ZCOLL_CHECK_LT(0, local_size_, "every node holds a rank");
  rank_at_.assign(static_cast<std::size_t>(nodes_) * local_size_, -1);
  for (int n = 0; n < nodes_; ++n)
    for (int l = 0; l < static_cast<int>(members[n].size()); ++l) {
      const int r = members[n][l];
      if (l < local_size_) rank_at_[static_cast<std::size_t>(n) * local_size_ + l] = r;
      if (r == comm.rank()) node_ = n, local_ = l;
    }
  const std::vector<int>& mine = members[node_];
  if (!core()) partner_ = mine[local_ % local_size_];
  for (int l = local_size_; l < static_cast<int>(mine.size()) && core(); ++l)
    if (l % local_size_ == local_) extras_.push_back(mine[l]);
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
