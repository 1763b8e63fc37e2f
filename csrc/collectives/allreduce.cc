// Allreduce entry point: validate, short-circuit one rank, resolve `auto`, dispatch.
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/call_scope.h"
#include "common/check.h"
#include "kernels/reduce.h"

namespace zcoll {

Algorithm allreduce(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                    const AllreduceOptions& options) {
  validate_op(dtype, options.op);
  algorithm_name(options.algorithm);  // throws for a code that names no algorithm
  const std::size_t bytes = count * dtype_size(dtype);
  ZCOLL_REQUIRE(count == 0 || (in != nullptr && out != nullptr), "allreduce: null buffer");
  Algorithm algorithm = options.algorithm;
  if (algorithm == Algorithm::kAuto) {
    Capabilities caps;
    caps.native_fast = comm.has_native_allreduce() && !comm.oversubscribed();
    caps.shared_memory = comm.has_shared_arena();
    caps.oversubscribed = comm.oversubscribed();
    // Equal nodes only: the fold of unequal ones is serial, and a node of many extras can lose
    // more than the link saves (docs/algorithms.md).
    caps.node_hierarchy = comm.node_count() > 1 && comm.ranks_per_node() > 1;
    caps.ordered_ring_gain = comm.topology().known() ? comm.topology().ring_gain : 1.0;
    algorithm = choose_allreduce_algorithm(bytes, comm.size(), caps);
  }
  // Refused whatever the count and rank count, so a small test fails like the job at scale.
  ZCOLL_REQUIRE(algorithm != Algorithm::kMpi || comm.has_native_allreduce(),
                "algorithm 'mpi' needs a transport with its own allreduce (MPI); use 'ring' or 'auto'");
  ZCOLL_REQUIRE(algorithm != Algorithm::kShm || comm.has_shared_arena(),
                "algorithm 'shm' needs every rank on one node and ZCOLL_SHM unset or 1; use 'ring' or 'auto'");
  ZCOLL_REQUIRE(algorithm != Algorithm::kOrderedRing || comm.topology().known(),
                "algorithm 'ordered_ring' needs measured links: set ZCOLL_TOPOLOGY to a `zcoll probe` result "
                "(probe.json) or call Communicator.set_topology(); use 'ring' or 'auto'");
  // The resolved algorithm is part of the header: ranks running different ones would hang.
  detail::CallHeader header;
  header.collective = detail::Collective::kAllreduce;
  header.dtype = static_cast<long long>(dtype);
  header.op = static_cast<long long>(options.op);
  header.count = static_cast<long long>(count);
  header.algorithm = static_cast<long long>(algorithm);
  if (algorithm == Algorithm::kOrderedRing) header.ring_order = static_cast<long long>(comm.topology().fingerprint);
  const detail::CallScope scope(comm, {"allreduce", count, dtype, algorithm_name(algorithm), op_name(options.op)});
  detail::check_same_call(comm, header, options.check_args);
  comm.stats().collectives += 1;
  if (count == 0) return algorithm;
  if (algorithm == Algorithm::kMpi) {
    comm.recorder().mark_in_progress();
    comm.native_allreduce(in, out, count, dtype, options.op);
    return algorithm;
  }
  if (comm.size() == 1) {
    if (in != out) std::memcpy(out, in, bytes);
    return algorithm;
  }
  switch (algorithm) {
    case Algorithm::kRing: allreduce_ring(comm, in, out, count, dtype, options.op, options.pipeline); break;
    case Algorithm::kTree: allreduce_tree(comm, in, out, count, dtype, options.op, options.pipeline); break;
    case Algorithm::kRecursiveDoubling:
      allreduce_recursive_doubling(comm, in, out, count, dtype, options.op, options.pipeline);
      break;
    case Algorithm::kHalvingDoubling:
      allreduce_halving_doubling(comm, in, out, count, dtype, options.op, options.pipeline);
      break;
    case Algorithm::kShm: allreduce_shm(comm, in, out, count, dtype, options.op); break;
    case Algorithm::kHierarchical:
      allreduce_hierarchical(comm, in, out, count, dtype, options.op, options.pipeline);
      break;
    case Algorithm::kOrderedRing:
      allreduce_ring(comm, in, out, count, dtype, options.op, options.pipeline, &comm.topology().ring);
      break;
    case Algorithm::kAuto:
    case Algorithm::kMpi: break;
  }
  return algorithm;
}

}  // namespace zcoll
