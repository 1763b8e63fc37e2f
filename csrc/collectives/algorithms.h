// The algorithm entry points behind the dispatchers (one file each). Arguments are validated
// by the caller; p >= 2.
#pragma once
#include <cstddef>
#include <vector>

#include "collectives/algorithm_table.h"
#include "collectives/options.h"

namespace zcoll {

// Allreduce: each file's entry point (the uniform AllreduceEntry) and its cost (AllreduceCost,
// the formula of docs/algorithms.md), listed in the descriptor table (algorithm_table.cc).
// The ring; around args.order when set (ordered_ring).
void allreduce_ring(Communicator&, const AllreduceArgs&);
double allreduce_ring_cost(const CostQuery&);
void allreduce_tree(Communicator&, const AllreduceArgs&);
double allreduce_tree_cost(const CostQuery&);
void allreduce_recursive_doubling(Communicator&, const AllreduceArgs&);
double allreduce_recursive_doubling_cost(const CostQuery&);
void allreduce_halving_doubling(Communicator&, const AllreduceArgs&);
double allreduce_halving_doubling_cost(const CostQuery&);
// The transport's own allreduce (MPI_Allreduce), for side-by-side comparison; no cost model.
void allreduce_mpi(Communicator&, const AllreduceArgs&);
// Through the transport's shared memory (every rank on one node); args.pipeline is not used.
void allreduce_shm(Communicator&, const AllreduceArgs&);
double allreduce_shm_cost(const CostQuery&);
// Node-local reduce-scatter, inter-node ring allreduce of each shard, node-local allgather
// (allreduce_hierarchical.cc). On nodes of different sizes, the ranks beyond the smallest node's
// size fold into the others first (hierarchy.h).
void allreduce_hierarchical(Communicator&, const AllreduceArgs&);
double allreduce_hierarchical_cost(const CostQuery&);

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
enum class Collective : long long {
  kAllreduce = 0,
  kReduceScatter,
  kAllgather,
  kBroadcast,
  kReduce,
  kAllreduceCompressed,
};

// ZCOLL_CHECK mode: every rank contributes this header describing its call (fixed size, so the
// exchange itself cannot mismatch); if any two differ, every rank throws MismatchError naming
// the first differing field (in this order) and the first rank that differs from rank 0.
// Fields a collective does not use stay 0 on every rank.
struct CallHeader {
  Collective collective = Collective::kAllreduce;
  long long dtype = 0;            // DType
  long long op = 0;               // ReduceOp
  long long count = 0;            // elements
  long long root = 0;             // broadcast, reduce
  long long algorithm = 0;        // allreduce: the Algorithm that will run (auto resolved)
  long long compression = 0;      // compressed allreduce: the Compression kind
  long long bits = 0;             // kQuantize: bits per code
  long long block = 0;            // kQuantize: elements per scale
  long long ratio_bits = 0;       // top-k / random-k: the ratio's IEEE-754 bits (exact compare)
  long long exact_topk = 0;       // top-k: the global top-k (one segment) instead of blockwise
  long long ring_order = 0;       // ordered_ring: the fingerprint of the ring order (Topology)
};
// Exchanges the headers (a ring allgather on the engine) when check mode is on for this call:
// `requested` (an explicit argument) or ZCOLL_CHECK.
void check_same_call(Communicator& comm, const CallHeader& mine, bool requested);
bool check_mode_from_env();  // ZCOLL_CHECK
}  // namespace detail

}  // namespace zcoll
