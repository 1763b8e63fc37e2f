// Options structs and the public entry points of the collectives. Every entry point validates
// its arguments, short-circuits a single rank and dispatches to one algorithm per file.
#pragma once
#include <cstddef>
#include <string>

#include "comm/communicator.h"
#include "common/dtype.h"

namespace zcoll {

// The allreduce algorithms with a name in code (auto's rules, the compressed path); their codes
// index the descriptor table (algorithm_table.h), which may hold more, registered at run time.
enum class Algorithm : int {
  kAuto = 0,
  kRing = 1,
  kTree = 2,
  kRecursiveDoubling = 3,
  kHalvingDoubling = 4,
  kMpi = 5,  // the MPI library's own MPI_Allreduce, for side-by-side comparison
  kShm = 6,  // through node-local shared memory (all ranks on one node)
  kHierarchical = 7,  // node-local reduce-scatter, inter-node ring per shard, node-local allgather
  kOrderedRing = 8,   // the ring in the order the communicator's Topology chose (measured links)
};

// The descriptor table's name for a code, and back (algorithm_table.cc); both throw
// std::invalid_argument for what names no algorithm (parse_algorithm listing the valid names).
const char* algorithm_name(Algorithm algorithm);
Algorithm parse_algorithm(const std::string& name);

// Pipelining knobs shared by all algorithms. Messages never exceed max_segment_bytes, so a
// transfer of one segment overlaps the reduction of the previous one; tests set it small to
// reach multi-segment code with small inputs.
struct PipelineOptions {
  std::size_t max_segment_bytes = 0;  // 0: default_segment_bytes()
  int depth = 0;                      // receives posted ahead; 0: default_pipeline_depth()
};
// The defaults in force: ZCOLL_SEGMENT_BYTES (128 KiB) and ZCOLL_PIPELINE_DEPTH (4), through
// common/env.h, for tuning without rebuilding.
std::size_t default_segment_bytes();
int default_pipeline_depth();

struct AllreduceOptions {
  ReduceOp op = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kAuto;
  PipelineOptions pipeline;
  bool check_args = false;  // exchange a small header first; raise MismatchError on every rank
};

struct ReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  PipelineOptions pipeline;
  bool check_args = false;
};

struct CollectiveOptions {
  int root = 0;  // broadcast only
  PipelineOptions pipeline;
  bool check_args = false;
};

// out[i] = in_0[i] OP ... OP in_{p-1}[i] on every rank, bitwise identical on all ranks.
// in == out is in-place. Returns the algorithm that ran (auto resolved).
Algorithm allreduce(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                    const AllreduceOptions& options = {});

// Reduces `count` elements and leaves on rank r its block of the result: elements
// [block_begin(r), block_begin(r) + block_count(r)) with blocks as equal as possible, the first
// count % p ranks holding one more. `out` holds block_count(rank) elements.
void reduce_scatter(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                    const ReduceOptions& options = {});

// out (count * p elements) = concatenation of every rank's `count` elements, in rank order.
// in may point at out + rank * count (in-place).
void allgather(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
               const CollectiveOptions& options = {});

// buf on every rank = buf on options.root.
void broadcast(Communicator& comm, void* buf, std::size_t count, DType dtype,
               const CollectiveOptions& options = {});

// out on options.root = reduction of every rank's in; out is ignored (may be null) elsewhere.
void reduce(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
            const ReduceOptions& options = {});

void barrier(Communicator& comm);

// The block layout reduce_scatter uses.
std::size_t block_begin(std::size_t count, int parts, int index);
std::size_t block_count(std::size_t count, int parts, int index);

// What the communicator offers beyond point-to-point, for `auto`.
struct Capabilities {
  bool native_fast = false;  // the transport's own allreduce, not crippled by oversubscription
  bool shared_memory = false;  // every rank on one node
  bool oversubscribed = false;
  bool node_hierarchy = false;  // several nodes, each with the same number (> 1) of ranks
  double ordered_ring_gain = 1.0;  // Topology::ring_gain: how much faster the ordered ring's slowest hop is
  bool topology = false;           // measured links (Topology::known())
  int nodes = 0;                   // how many nodes (node_hierarchy); 0: not known
  double node_link_ratio = 0.0;    // Topology::node_link_ratio: node-local / inter-node bandwidth; 0: not known
  double slow_node_factor = 0.0;   // Topology::slow_node_factor: links' / slowest node's; 0: not known
};
// The choice `auto` makes for a message of `bytes` on `ranks` ranks (rules in auto_select.cc).
Algorithm choose_allreduce_algorithm(std::size_t bytes, int ranks, const Capabilities& caps);

}  // namespace zcoll
