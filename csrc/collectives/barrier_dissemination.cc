// Dissemination barrier (Hensgen, Finkel and Manber).
//
// Phases:  ceil(log2 p) rounds; in round k rank r signals r + 2^k and waits for r - 2^k.
//          After the last round every rank has heard, directly or not, from every other.
// Cost:    ceil(log2 p) alpha, no payload.
#include "collectives/algorithms.h"
#include "collectives/pipeline.h"
#include "collectives/ring.h"

namespace zcoll {

void barrier_dissemination(Communicator& comm) {
  const int p = comm.size(), r = comm.rank();
  char token = 0, sink = 0;
  for (int dist = 1; dist < p; dist *= 2)
    comm.sendrecv(&token, 1, detail::mod(r + dist, p), &sink, 1, detail::mod(r - dist, p),
                  detail::kTagBarrier);
}

}  // namespace zcoll
