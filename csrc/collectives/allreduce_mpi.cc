// The transport's own allreduce (MPI_Allreduce for MPI), offered as algorithm "mpi" so that
// users and benchmarks can compare zcoll's algorithms with the MPI library's side by side.
//
// Purpose: a reference, and `auto`'s choice for small messages where MPICH's shared-memory
//          collectives beat any point-to-point schedule (auto_select.cc).
// Phases:  one call of the transport (MpiCommunicator chunks counts beyond 2^30 elements and
//          waits with the watchdog's polls). It also runs on one rank (the descriptor's
//          copy_on_one_rank is off): a reference measures the library, not zcoll's shortcut.
// Cost:    the MPI library's; the table has no model for it.
#include "collectives/algorithms.h"

namespace zcoll {

void allreduce_mpi(Communicator& comm, const AllreduceArgs& a) {
  comm.recorder().mark_in_progress();
  comm.native_allreduce(a.in, a.out, a.count, a.dtype, a.op);
}

}  // namespace zcoll
