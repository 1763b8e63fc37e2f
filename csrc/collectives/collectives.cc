// Entry points of the non-allreduce collectives (validate, one-rank shortcut, dispatch) and the
// reduce_scatter block layout. (The allreduce algorithms' names: algorithm_table.cc.)
#include <cstdlib>
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/call_scope.h"
#include "common/check.h"
#include "common/env.h"
#include "kernels/reduce.h"

namespace zcoll {
namespace {

void maybe_check(Communicator& comm, bool requested, detail::Collective collective, DType dtype, ReduceOp op,
                 std::size_t count, int root) {
  detail::CallHeader h;
  h.collective = collective;
  h.dtype = static_cast<long long>(dtype);
  h.op = static_cast<long long>(op);
  h.count = static_cast<long long>(count);
  h.root = root;
  detail::check_same_call(comm, h, requested);
}

void require_root(const Communicator& comm, int root) {
  ZCOLL_REQUIRE(root >= 0 && root < comm.size(), "root ", root, " out of range for ", comm.size(),
                " ranks (valid: 0..", comm.size() - 1, ")");
}

}  // namespace

std::size_t default_segment_bytes() {
  return static_cast<std::size_t>(env::get_int(env::Var::kSegmentBytes));
}

int default_pipeline_depth() { return static_cast<int>(env::get_int(env::Var::kPipelineDepth)); }

std::size_t block_count(std::size_t count, int parts, int index) {
  const std::size_t p = static_cast<std::size_t>(parts);
  return count / p + (static_cast<std::size_t>(index) < count % p ? 1 : 0);
}

std::size_t block_begin(std::size_t count, int parts, int index) {
  const std::size_t p = static_cast<std::size_t>(parts), i = static_cast<std::size_t>(index);
  return i * (count / p) + std::min(i, count % p);
}

void reduce_scatter(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                    const ReduceOptions& options) {
  validate_op(dtype, options.op);
  const detail::CallScope scope(comm, {"reduce_scatter", count, dtype, "ring", op_name(options.op)});
  maybe_check(comm, options.check_args, detail::Collective::kReduceScatter, dtype, options.op, count, 0);
  comm.stats().collectives += 1;
  const std::size_t mine = block_count(count, comm.size(), comm.rank());
  if (count == 0) return;
  if (comm.size() == 1) {
    if (in != out) std::memcpy(out, in, mine * dtype_size(dtype));
    return;
  }
  reduce_scatter_ring(comm, in, out, count, dtype, options.op, options.pipeline);
}

void allgather(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
               const CollectiveOptions& options) {
  const detail::CallScope scope(comm, {"allgather", count, dtype, "ring"});
  maybe_check(comm, options.check_args, detail::Collective::kAllgather, dtype, ReduceOp::kSum, count, 0);
  comm.stats().collectives += 1;
  if (count == 0) return;
  if (comm.size() == 1) {
    if (in != out) std::memmove(out, in, count * dtype_size(dtype));
    return;
  }
  allgather_ring(comm, in, out, count, dtype, options.pipeline);
}

void broadcast(Communicator& comm, void* buf, std::size_t count, DType dtype,
               const CollectiveOptions& options) {
  require_root(comm, options.root);
  const detail::CallScope scope(comm, {"broadcast", count, dtype, "tree", "", options.root});
  maybe_check(comm, options.check_args, detail::Collective::kBroadcast, dtype, ReduceOp::kSum, count,
              options.root);
  comm.stats().collectives += 1;
  if (count == 0 || comm.size() == 1) return;
  broadcast_tree(comm, buf, count, dtype, options.root, options.pipeline);
}

void reduce(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
            const ReduceOptions& options) {
  validate_op(dtype, options.op);
  require_root(comm, options.root);
  const detail::CallScope scope(comm, {"reduce", count, dtype, "tree", op_name(options.op), options.root});
  maybe_check(comm, options.check_args, detail::Collective::kReduce, dtype, options.op, count, options.root);
  comm.stats().collectives += 1;
  if (count == 0) return;
  if (comm.size() == 1) {
    if (in != out) std::memcpy(out, in, count * dtype_size(dtype));
    return;
  }
  reduce_tree(comm, in, out, count, dtype, options.op, options.root, options.pipeline);
}

void barrier(Communicator& comm) {
  const detail::CallScope scope(comm, {"barrier", 0, DType::kUInt8, "dissemination"});
  comm.stats().collectives += 1;
  if (comm.size() > 1) barrier_dissemination(comm);
}

}  // namespace zcoll
