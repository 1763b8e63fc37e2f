// Allreduce entry point: validate, resolve `auto`, check what the algorithm needs, short-circuit
// one rank, dispatch through the algorithm's descriptor (algorithm_table.h): a lookup by code
// and one indirect call, no per-algorithm code here.
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/call_scope.h"
#include "common/check.h"
#include "kernels/reduce.h"

namespace zcoll {
namespace {

Capabilities capabilities_of(Communicator& comm) {
  Capabilities caps;
  caps.native_fast = comm.has_native_allreduce() && !comm.oversubscribed();
  caps.shared_memory = comm.has_shared_arena();
  caps.oversubscribed = comm.oversubscribed();
  // Equal nodes only: the fold of unequal ones is serial, and a node of many extras can lose
  // more than the link saves (docs/algorithms.md).
  caps.node_hierarchy = comm.node_count() > 1 && comm.ranks_per_node() > 1;
  caps.nodes = comm.node_count();
  caps.topology = comm.topology().known();
  caps.ordered_ring_gain = caps.topology ? comm.topology().ring_gain : 1.0;
  // From the same probe every rank read (ZCOLL_TOPOLOGY), so every rank agrees on it.
  caps.node_link_ratio = caps.topology ? comm.topology().node_link_ratio : 0.0;
  caps.slow_node_factor = caps.topology ? comm.topology().slow_node_factor : 0.0;
  return caps;
}

}  // namespace

Algorithm allreduce(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                    const AllreduceOptions& options) {
  validate_op(dtype, options.op);
  allreduce_algorithm(options.algorithm);  // throws for a code that names no algorithm
  const std::size_t bytes = count * dtype_size(dtype);
  ZCOLL_REQUIRE(count == 0 || (in != nullptr && out != nullptr), "allreduce: null buffer");
  Algorithm algorithm = options.algorithm;
  if (algorithm == Algorithm::kAuto)
    algorithm = choose_allreduce_algorithm(bytes, comm.size(), capabilities_of(comm));
  const AlgorithmDescriptor& chosen = allreduce_algorithm(algorithm);
  // Refused whatever the count and rank count, so a small test fails like the job at scale.
  require_needs(comm, chosen);
  // The resolved algorithm is part of the header: ranks running different ones would hang.
  detail::CallHeader header;
  header.collective = detail::Collective::kAllreduce;
  header.dtype = static_cast<long long>(dtype);
  header.op = static_cast<long long>(options.op);
  header.count = static_cast<long long>(count);
  header.algorithm = static_cast<long long>(algorithm);
  if (chosen.topology_order) header.ring_order = static_cast<long long>(comm.topology().fingerprint);
  const detail::CallScope scope(comm, {"allreduce", count, dtype, chosen.name, op_name(options.op)});
  detail::check_same_call(comm, header, options.check_args);
  comm.stats().collectives += 1;
  if (count == 0) return algorithm;
  if (comm.size() == 1 && chosen.copy_on_one_rank) {
    if (in != out) std::memcpy(out, in, bytes);
    return algorithm;
  }
  AllreduceArgs args{in, out, count, dtype, options.op, options.pipeline};
  if (chosen.topology_order) args.order = &comm.topology().ring;
  chosen.entry(comm, args);
  return algorithm;
}

}  // namespace zcoll
