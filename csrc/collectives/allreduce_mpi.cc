// The transport's own allreduce (MPI_Allreduce for MPI), offered as algorithm "mpi" so that
// users and benchmarks can compare zcoll's algorithms with the MPI library's side by side.
//
// Purpose: a reference, and `auto`'s choice for small messages where MPICH's shared-memory
//          collectives beat any point-to-point schedule (auto_select.cc).
// Phases:  one call of the transport (MpiCommunicator chunks counts beyond 2^30 elements and
//          waits with the watchdog's polls). It also runs on one rank (the descriptor's
//          copy_on_one_rank is off): a reference measures the library, not zcoll's shortcut.
//          Exception: sum / prod / avg of 8-bit integers run zcoll's ring instead. Open MPI 5's
//          op/avx component adds 8- and 16-bit integers with saturating instructions (127 + 1
//          gives 127), where zcoll promises two's-complement wrapping as numpy does; the ring's
//          kernels wrap on every engine. min / max / bitwise ops cannot overflow and stay MPI's.
// Cost:    the MPI library's; the table has no model for it (the ring's for the exception).
#include "collectives/algorithms.h"

namespace zcoll {
namespace {

bool may_saturate_in_mpi(DType dtype, ReduceOp op) {
  const ReduceLanes lanes = reduce_lanes(dtype, op);
  const bool narrow_int = lanes.dtype == DType::kInt8 || lanes.dtype == DType::kUInt8;
  const bool adds = lanes.op == ReduceOp::kSum || lanes.op == ReduceOp::kProd || lanes.op == ReduceOp::kAvg;
  return narrow_int && adds;
}

}  // namespace

void allreduce_mpi(Communicator& comm, const AllreduceArgs& a) {
  if (comm.size() > 1 && may_saturate_in_mpi(a.dtype, a.op)) {
    allreduce_ring(comm, a);
    return;
  }
  comm.recorder().mark_in_progress();
  comm.native_allreduce(a.in, a.out, a.count, a.dtype, a.op);
}

}  // namespace zcoll
