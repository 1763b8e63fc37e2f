// The two-level view of a communicator the hierarchical allreduce runs on: nodes
// (Communicator::node_of) of L ranks each, and a rank's local index on its node. No
// sub-communicator is created: the schedule addresses the communicator's own ranks through this
// map, so every message still passes the engine's one Channel.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "collectives/pipeline.h"
#include "comm/communicator.h"

namespace zcoll::detail {

// Nodes of different sizes: L is the smallest node's size; the first L ranks of each node form
// the grid ("core" ranks), and every other rank is an extra that folds into the core rank of its
// node with local index (its index mod L): it sends its input there first and gets the result
// back at the end (allreduce_hierarchical.cc).
class NodeGrid {
 public:
  explicit NodeGrid(const Communicator& comm);
  int nodes() const { return nodes_; }             // N
  int local_size() const { return local_size_; }   // L
  int node() const { return node_; }               // this rank's node, 0..N-1
  int local() const { return local_; }             // this rank's index on its node (ascending ranks)
  bool core() const { return local_ < local_size_; }
  bool equal() const { return equal_; }            // every node has L ranks: no extras anywhere
  int partner() const { return partner_; }         // an extra's core rank (-1 on a core rank)
  const std::vector<int>& extras() const { return extras_; }  // a core rank's extras, ascending
  // The core rank with local index l on node n (both taken modulo their ranges).
  int rank(int n, int l) const { return rank_at_[mod(n, nodes_) * local_size_ + mod(l, local_size_)]; }

 private:
  int nodes_, local_size_ = 0, node_ = 0, local_ = 0, partner_ = -1;
  bool equal_ = true;
  std::vector<int> rank_at_;  // rank_at_[n * L + l]
  std::vector<int> extras_;
};

// "2, 2" / "3, 1": the ranks on each node, for messages.
std::string node_sizes(const Communicator& comm);

// Where the data lies: the buffer of `count` elements cut into nblk blocks of whole granules,
// block b into L shards (shard l is what the ranks with local index l reduce across nodes),
// each shard into N chunks (the inter-node ring's chunks). Blocks are as many as needed for a
// chunk to hold at most `chunk_elems` elements (rounded to granules), so one inter-node message
// is at most a segment.
class HierLayout {
 public:
  HierLayout(std::size_t count, std::size_t granule, int local_size, int nodes, std::size_t chunk_elems);
  std::size_t blocks() const { return nblk_; }
  Range block(std::size_t b) const { return elements(block_granules(b)); }
  Range shard(std::size_t b, int l) const { return elements(shard_granules(b, l)); }
  Range chunk(std::size_t b, int l, int k) const {
    return elements(split(shard_granules(b, mod(l, L_)), static_cast<std::size_t>(N_), static_cast<std::size_t>(mod(k, N_))));
  }
  std::size_t max_shard_elems() const;
  std::size_t max_chunk_elems() const;

 private:
  Range block_granules(std::size_t b) const { return split(Range{0, granules_}, nblk_, b); }
  Range shard_granules(std::size_t b, int l) const {
    return split(block_granules(b), static_cast<std::size_t>(L_), static_cast<std::size_t>(mod(l, L_)));
  }
  Range elements(Range g) const;

  std::size_t count_, granule_, granules_, nblk_;
  int L_, N_;
};

}  // namespace zcoll::detail
