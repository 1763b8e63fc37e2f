// Tree allreduce: pipelined reduce to rank 0 over a binary tree, then pipelined broadcast.
//
// Purpose: logarithmic depth with pipelining; wins at mid sizes on many ranks.
// Phases:  1. tree_reduce_phase rooted at 0 (interior ranks accumulate in `out`);
//          2. tree_broadcast_phase of the root's result into `out` everywhere.
//          One reduction order per segment, then copies: bitwise identical results.
// Cost:    (log2 p' + nseg) (2 alpha + 4 seg beta + 2 seg gamma), p' the largest power of two
//          <= p (the tree's depth is log2 p'), seg = min(S, segment), nseg = ceil(S / segment):
//          each phase takes depth + nseg segment steps, and an interior rank receives two segments
//          and reduces them per reduce step, sends two per broadcast step (2 S beta per phase).
//          (NCCL's double binary tree would halve the per-rank bytes; not done yet.)
#include <algorithm>
#include <cmath>

#include "collectives/algorithms.h"
#include "collectives/fold.h"
#include "collectives/tree.h"

namespace zcoll {

void allreduce_tree(Communicator& comm, const AllreduceArgs& a) {
  const detail::BinaryTree tree = detail::make_tree(comm.rank(), comm.size(), /*root=*/0);
  detail::tree_reduce_phase(comm, tree, a.in, a.out, a.count, a.dtype, a.op, a.pipeline);
  detail::tree_broadcast_phase(comm, tree, a.out, a.count, a.dtype, a.pipeline);
}

double allreduce_tree_cost(const CostQuery& q) {
  const double seg = std::min(q.bytes, q.segment_bytes);
  const double nseg = std::max(1.0, std::ceil(q.bytes / q.segment_bytes));
  return (detail::log2_floor(q.ranks) + nseg) * (2 * q.alpha + 4 * seg * q.beta + 2 * seg * q.gamma);
}

}  // namespace zcoll
