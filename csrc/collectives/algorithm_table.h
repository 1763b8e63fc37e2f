// The allreduce algorithms as one table: every algorithm is one AlgorithmDescriptor (name, what
// it needs from the communicator, its alpha-beta-gamma cost, its entry point), indexed by its
// Algorithm code. The dispatcher (allreduce.cc), `auto`'s requirements (auto_select.cc), the
// names Python sees (zcoll._C.Algorithm, zcoll._C.allreduce_algorithms()), the benchmark's `-a`
// list and check mode's messages all read it; docs/algorithms.md has a section per entry, which
// the Python test test_algorithm_table.py holds it to.
//
// Adding an algorithm: its own file (entry point + cost function, declared in algorithms.h and
// listed in CMakeLists.txt), one line in kBuiltins (algorithm_table.cc), its section in
// docs/algorithms.md and its test; or, from C++ at run time, register_allreduce_algorithm()
// (docs/algorithms.md, "Adding an allreduce algorithm").
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "collectives/options.h"

namespace zcoll {

// What an algorithm needs beyond point-to-point messages (bit flags of AlgorithmDescriptor::needs).
enum Need : unsigned {
  kNeedsNothing = 0,
  kNeedsNativeAllreduce = 1u << 0,  // the transport's own allreduce (MPI)
  kNeedsSharedMemory = 1u << 1,     // every rank on one node, the transport's shared memory offered
  kNeedsTopology = 1u << 2,         // measured link bandwidths (Communicator::topology())
};
inline constexpr unsigned kAllNeeds = kNeedsNativeAllreduce | kNeedsSharedMemory | kNeedsTopology;

// One allreduce call as every entry point takes it (validated; p >= 2, count >= 1).
struct AllreduceArgs {
  const void* in = nullptr;
  void* out = nullptr;  // in == out: in place
  std::size_t count = 0;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  PipelineOptions pipeline;
  // The ring order (Topology::ring; order[k] sends to order[k+1]): the topology's for a
  // descriptor with topology_order, else null (rank order).
  const std::vector<int>* order = nullptr;
};
using AllreduceEntry = void (*)(Communicator& comm, const AllreduceArgs& args);

// The point a cost function is evaluated at (docs/algorithms.md's notation).
struct CostQuery {
  double bytes = 0.0;                 // S, per rank
  int ranks = 2;                      // p
  double alpha = 0.0;                 // seconds per message
  double beta = 0.0;                  // seconds per byte on the wire
  double gamma = 0.0;                 // seconds per byte reduced
  int nodes = 1;                      // N: the ranks as N nodes of p / N ranks (hierarchical)
  double segment_bytes = 128 * 1024;  // the pipeline's segment (tree), ZCOLL_SEGMENT_BYTES' default
};
using AllreduceCost = double (*)(const CostQuery& q);  // seconds

struct AlgorithmDescriptor {
  const char* name = "";           // what users pass: algorithm="ring", zcoll_allreduce_perf -a ring
  unsigned needs = kNeedsNothing;  // Need bits; a call without them throws naming the missing one
  AllreduceCost cost = nullptr;    // the model of docs/algorithms.md; null: none (auto, mpi)
  AllreduceEntry entry = nullptr;  // null only for auto, which the dispatcher resolves first
  bool topology_order = false;     // runs around the topology's ring order (ordered_ring)
  bool copy_on_one_rank = true;    // p == 1: a copy instead of the entry (mpi runs MPI's own)
};

// Algorithms known so far: the built-ins, then those registered, by code.
int num_allreduce_algorithms();
// The descriptor of a code; std::invalid_argument for a code that names no algorithm.
const AlgorithmDescriptor& allreduce_algorithm(Algorithm algorithm);
// The descriptor named `name`, or nullptr.
const AlgorithmDescriptor* find_allreduce_algorithm(const std::string& name);
// Every name, in code order, joined by `separator` ("auto ring tree ...").
std::string allreduce_algorithm_names(const char* separator = " ");

// Adds an algorithm (the name is copied) and returns its code, which parse_algorithm() and
// allreduce() then accept like a built-in's. Throws std::invalid_argument for an empty or taken
// name, a null entry or unknown needs. Safe against concurrent dispatch; an algorithm stays
// registered for the life of the process. Python's zcoll._C.Algorithm lists those registered
// before the module was imported.
Algorithm register_allreduce_algorithm(const AlgorithmDescriptor& descriptor);

// Whether comm offers every Need in `needs`.
bool offers_needs(Communicator& comm, unsigned needs);
// Throws std::invalid_argument, "algorithm 'NAME' needs WHAT; use 'ring' or 'auto'", when comm
// lacks something the descriptor needs.
void require_needs(Communicator& comm, const AlgorithmDescriptor& descriptor);
// The Need bits `auto` may count on (Capabilities in options.h).
unsigned offered_needs(const Capabilities& caps);

}  // namespace zcoll
