// Ring allreduce (reduce-scatter + allgather; Baidu / Horovod / NCCL ring).
//
// Purpose: bandwidth-optimal allreduce for large messages.
// Phases:  1. ring_reduce_scatter_phase (shift 0): step 0 sends from `in`, every reduction
//             writes OP(incoming, in) into `out`, so out-of-place needs no initial copy; rank r
//             ends owning fully reduced chunk r+1 (divided by p for avg).
//          2. ring_allgather_phase (shift 1): the owned chunks circulate into `out`.
//          Each chunk is reduced by one fixed sequence of ranks and then copied, so every rank
//          ends with the same bits.
// Cost:    2(p-1) alpha + 2(p-1)/p S beta + (p-1)/p S gamma.
#include "collectives/pipeline.h"
#include "collectives/ring.h"

namespace zcoll {

void allreduce_ring(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                    ReduceOp op, const PipelineOptions& pipeline) {
  const int p = comm.size();
  const int owned = detail::mod(comm.rank() + 1, p);
  auto* final_chunk = static_cast<unsigned char*>(out) + block_begin(count, p, owned) * dtype_size(dtype);
  detail::ring_reduce_scatter_phase(comm, in, out, final_chunk, count, dtype, op, /*shift=*/0, pipeline);
  detail::ring_allgather_phase(comm, out, count, dtype, /*shift=*/1, pipeline);
}

}  // namespace zcoll
