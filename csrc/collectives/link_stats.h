// comm.link_stats(): every rank's link telemetry (comm/telemetry.h), gathered to every rank.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace zcoll {

// Collective. Returns p rows of link_stats_row_length(p) int64 values, row r from rank r:
//   [0] base_ns  [1] calls  [2] arrival_sum  [3] duration_sum      (LinkTelemetry::row)
//   [4 .. 4+p)   clock offsets clock_r - clock_0 in ns, as rank 0 measured them (row 0 only;
//                0 for ranks on rank 0's machine, which share its clock)
//   then per peer j: sent_bytes, sends, send_post_sum, recv_bytes, recvs, recv_done_sum
// Times are ns of each rank's own CLOCK_MONOTONIC relative to its base_ns. The gather itself
// is not recorded. With `reset`, every rank's telemetry starts a new window afterwards.
// Cost: p ping-pongs of 8 rounds with rank 0 for ranks on other machines, and an allgather of
// p x (3 + 7p) int64 values (O(p^2) bytes on every rank: meant for tens of ranks, not thousands).
std::vector<std::int64_t> gather_link_stats(Communicator& comm, bool reset);
inline std::size_t link_stats_row_length(int p) {
  return LinkTelemetry::kHead + static_cast<std::size_t>(p) * (1 + LinkTelemetry::kPerPeer);
}

}  // namespace zcoll
