// The two phases of a ring, shared by ring allreduce, reduce_scatter and allgather.
//
// The buffer of `count` elements is cut into p chunks (chunk c = split(count, p, c)); each
// chunk into segments of at most max_segment_bytes. Rank r sends to r+1 and receives from r-1.
#pragma once
#include <cstddef>

#include "collectives/options.h"
#include "collectives/pipeline.h"
#include "comm/communicator.h"

namespace zcoll::detail {

// Reduce-scatter phase: p-1 steps; at step s rank r sends chunk (r - s + shift) and reduces the
// incoming chunk (r - s - 1 + shift) into it as OP(incoming, in). Partial results go to
// `partial` (a count-element buffer, indexed like `in`; may be `out` itself), the fully reduced
// chunk (r + shift + 1 - p, i.e. chunk r + shift + 1) to `final_chunk`. With op avg the final
// chunk is divided by p in the same pass.
// Cost: (p-1) steps, (p-1)/p * S bytes sent and reduced per rank.
void ring_reduce_scatter_phase(Communicator& comm, const void* in, void* partial, void* final_chunk,
                               std::size_t count, DType dtype, ReduceOp op, int shift,
                               const PipelineOptions& pipeline);

// Allgather phase: rank r holds chunk (r + shift) of `buf`; after p-1 steps every rank holds
// all chunks. Cost: (p-1) steps, (p-1)/p * S bytes sent per rank, received in place.
void ring_allgather_phase(Communicator& comm, void* buf, std::size_t count, DType dtype, int shift,
                          const PipelineOptions& pipeline);


}  // namespace zcoll::detail
