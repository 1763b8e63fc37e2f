// The algorithm entry points behind the dispatchers (one file each). Arguments are validated
// by the caller; p >= 2.
#pragma once
#include <cstddef>

#include "collectives/options.h"

namespace zcoll {

void allreduce_ring(Communicator&, const void* in, void* out, std::size_t count, DType, ReduceOp,
                    const PipelineOptions&);
void allreduce_tree(Communicator&, const void* in, void* out, std::size_t count, DType, ReduceOp,
                    const PipelineOptions&);
void allreduce_recursive_doubling(Communicator&, const void* in, void* out, std::size_t count, DType,
                                  ReduceOp, const PipelineOptions&);
void allreduce_halving_doubling(Communicator&, const void* in, void* out, std::size_t count, DType,
                                ReduceOp, const PipelineOptions&);
void allreduce_shm(Communicator&, const void* in, void* out, std::size_t count, DType, ReduceOp);
void reduce_scatter_ring(Communicator&, const void* in, void* out, std::size_t count, DType, ReduceOp,
                         const PipelineOptions&);
void allgather_ring(Communicator&, const void* in, void* out, std::size_t count, DType,
                    const PipelineOptions&);
void broadcast_tree(Communicator&, void* buf, std::size_t count, DType, int root,
                    const PipelineOptions&);
void reduce_tree(Communicator&, const void* in, void* out, std::size_t count, DType, ReduceOp,
                 int root, const PipelineOptions&);
void barrier_dissemination(Communicator&);

namespace detail {
// ZCOLL_CHECK mode: every rank contributes a small header describing the call; if any two
// differ, every rank throws MismatchError naming the first differing rank and field.
struct CallHeader {
  long long collective, dtype, op, count, root;
  long long algorithm = 0;  // allreduce: the algorithm that will run (auto resolved)
};
void check_same_call(Communicator& comm, const CallHeader& mine);
bool check_mode_from_env();  // ZCOLL_CHECK=1
}  // namespace detail

}  // namespace zcoll
