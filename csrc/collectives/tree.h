// Pipelined binary-tree phases shared by tree allreduce, reduce and broadcast.
//
// The tree is the binary heap over virtual ranks v = (rank - root) mod p: parent (v-1)/2,
// children 2v+1 and 2v+2, depth floor(log2 p). The buffer is cut into segments so that while
// one segment moves up (or down) a level, the next one moves on the level below.
#pragma once
#include <cstddef>

#include "collectives/options.h"
#include "comm/communicator.h"

namespace zcoll::detail {

struct BinaryTree {
  int parent = -1;  // real rank, -1 at the root
  int children[2] = {-1, -1};
  int num_children = 0;
};

BinaryTree make_tree(int rank, int p, int root);

// Reduce towards the root: acc = OP(OP(in, child0), child1) per segment, sent to the parent.
// Leaves send `in` itself. `acc` (count elements) receives the partial result on interior ranks
// and the final one on the root (divided by p for avg). Cost: about (depth + nseg) segment times,
// 2 S bytes received and reduced by interior ranks.
void tree_reduce_phase(Communicator& comm, const BinaryTree& tree, const void* in, void* acc,
                       std::size_t count, DType dtype, ReduceOp op, const PipelineOptions& pipeline);

// Broadcast from the root down the tree into `buf`. Cost: about (depth + nseg) segment times.
void tree_broadcast_phase(Communicator& comm, const BinaryTree& tree, void* buf, std::size_t count,
                          DType dtype, const PipelineOptions& pipeline);

}  // namespace zcoll::detail
