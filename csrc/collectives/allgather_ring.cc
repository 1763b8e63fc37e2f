// Ring allgather.
//
// Purpose: every rank ends with every rank's block, in rank order.
// Phases:  1. copy the local block into its place in `out` (skipped when in-place);
//          2. ring allgather steps: p-1 steps, each forwarding the block received the step
//             before, received straight into `out` (no scratch, no copy).
// Cost:    (p-1) alpha + (p-1)/p S beta  (S = bytes of the gathered result).
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace zcoll {

void allgather_ring(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                    const PipelineOptions& pipeline) {
  const std::size_t bytes = count * dtype_size(dtype);
  auto* mine = static_cast<unsigned char*>(out) + static_cast<std::size_t>(comm.rank()) * bytes;
  if (in != mine && bytes) std::memmove(mine, in, bytes);
  detail::ring_allgather_phase(comm, out, count * comm.size(), dtype, /*shift=*/0, pipeline);
}

}  // namespace zcoll
