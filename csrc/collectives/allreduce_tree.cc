// Tree allreduce: pipelined reduce to rank 0 over a binary tree, then pipelined broadcast.
//
// Purpose: logarithmic depth with pipelining; wins at mid sizes on many ranks.
// Phases:  1. tree_reduce_phase rooted at 0 (interior ranks accumulate in `out`);
//          2. tree_broadcast_phase of the root's result into `out` everywhere.
//          One reduction order per segment, then copies: bitwise identical results.
// Cost:    about 2 (log2 p + nseg) segment times; 2 S beta per phase on interior ranks.
//          (NCCL's double binary tree would halve the per-rank bytes; not done yet.)
#include "collectives/tree.h"

namespace zcoll {

void allreduce_tree(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                    ReduceOp op, const PipelineOptions& pipeline) {
  const detail::BinaryTree tree = detail::make_tree(comm.rank(), comm.size(), /*root=*/0);
  detail::tree_reduce_phase(comm, tree, in, out, count, dtype, op, pipeline);
  detail::tree_broadcast_phase(comm, tree, out, count, dtype, pipeline);
}

}  // namespace zcoll
