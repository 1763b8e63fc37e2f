// Ring reduce-scatter.
//
// Purpose: every rank ends with its block (block_begin/block_count) of the reduction.
// Phases:  1. ring reduce-scatter steps with shift -1, so rank r ends with chunk r; partial
//             sums live in a scratch buffer, the last step writes straight into `out`.
// Cost:    (p-1) alpha + (p-1)/p S beta + (p-1)/p S gamma  (S = bytes of the whole input).
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace zcoll {

void reduce_scatter_ring(Communicator& comm, const void* in, void* out, std::size_t count,
                         DType dtype, ReduceOp op, const PipelineOptions& pipeline) {
  // Partial sums of the chunks other ranks finish.
  void* partial = comm.scratch(count * dtype_size(dtype), Scratch::kPartial);
  detail::ring_reduce_scatter_phase(comm, in, partial, out, count, dtype, op, /*shift=*/-1, pipeline);
}

}  // namespace zcoll
