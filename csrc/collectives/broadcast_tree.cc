// Pipelined binary-tree broadcast.
//
// Phases:  1. tree_broadcast_phase rooted at `root`: each rank receives a segment from its
//             parent straight into `buf` and forwards it to its children while the next
//             segment arrives.
// Cost:    (log2 p + nseg) segment times; interior ranks send 2 S bytes.
#include "collectives/algorithms.h"
#include "collectives/tree.h"

namespace zcoll {

void broadcast_tree(Communicator& comm, void* buf, std::size_t count, DType dtype, int root,
                    const PipelineOptions& pipeline) {
  const detail::BinaryTree tree = detail::make_tree(comm.rank(), comm.size(), root);
  detail::tree_broadcast_phase(comm, tree, buf, count, dtype, pipeline);
}

}  // namespace zcoll
