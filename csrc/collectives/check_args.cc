// ZCOLL_CHECK mode: before a collective, every rank allgathers a 6-number header describing its
// call (collective, dtype, op, count, root) over the same communicator. A mismatch that would
// otherwise hang or corrupt (one rank sending more bytes than another expects) becomes a
// MismatchError raised on every rank, since every rank sees every header.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/pipeline.h"
#include "common/check.h"
#include "common/env.h"
#include "common/error.h"

namespace zcoll::detail {

bool check_mode_from_env() { return env::get_bool(env::Var::kCheck); }

void check_same_call(Communicator& comm, const CallHeader& mine) {
  const int p = comm.size();
  if (p == 1) return;
  constexpr int kFields = 6;
  const long long own[kFields] = {mine.collective, mine.dtype, mine.op, mine.count, mine.root, mine.algorithm};
  std::vector<long long> all(static_cast<std::size_t>(p) * kFields);
  std::memcpy(&all[static_cast<std::size_t>(comm.rank()) * kFields], own, sizeof(own));
  // A ring allgather of fixed-size headers: every rank sends and expects the same byte count,
  // whatever its arguments, so this exchange itself cannot mismatch.
  for (int s = 0; s < p - 1; ++s) {
    const int send_block = mod(comm.rank() - s, p), recv_block = mod(comm.rank() - s - 1, p);
    comm.sendrecv(&all[static_cast<std::size_t>(send_block) * kFields], sizeof(own), mod(comm.rank() + 1, p),
                  &all[static_cast<std::size_t>(recv_block) * kFields], sizeof(own), mod(comm.rank() - 1, p),
                  kTagCheck);
  }
  static const char* kNames[kFields] = {"collective", "dtype", "op", "count", "root", "algorithm"};
  for (int r = 1; r < p; ++r)
    for (int f = 0; f < kFields; ++f)
      if (all[static_cast<std::size_t>(r) * kFields + f] != all[f])
        throw MismatchError(concat("ranks disagree on the ", kNames[f], " of this collective: rank 0 passed ",
                                   all[f], ", rank ", r, " passed ", all[static_cast<std::size_t>(r) * kFields + f],
                                   " (detected by ZCOLL_CHECK; every rank raises this)"));
}

}  // namespace zcoll::detail
