// Pipelined binary-tree reduce.
//
// Phases:  1. tree_reduce_phase rooted at `root`; interior ranks keep partial results in a
//             scratch buffer, the root in `out` (divided by p for avg).
// Cost:    (log2 p + nseg) segment times; interior ranks receive and reduce 2 S bytes.
#include "collectives/algorithms.h"
#include "collectives/tree.h"

namespace zcoll {

void reduce_tree(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                 ReduceOp op, int root, const PipelineOptions& pipeline) {
  const detail::BinaryTree tree = detail::make_tree(comm.rank(), comm.size(), root);
  void* acc = comm.rank() == root ? out : comm.scratch(count * dtype_size(dtype), Scratch::kPartial);
  detail::tree_reduce_phase(comm, tree, in, acc, count, dtype, op, pipeline);
}

}  // namespace zcoll
