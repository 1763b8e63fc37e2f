// comm.link_stats(): clock offsets to rank 0, then an allgather of every rank's telemetry row.
//
// Phases:
//   1. offsets: rank 0 and each rank r on another machine exchange 8 timestamp round trips
//      (NTP's estimate: offset = ((t1 - t0) + (t2 - t3)) / 2 from the round with the smallest
//      round-trip time, so the error is at most half that round trip);
//   2. allgather of the rows (collectives/link_stats.h), with the telemetry paused so that the
//      gather does not measure itself; then an optional reset of every rank's window.
#include "collectives/link_stats.h"

#include <limits>

#include "collectives/call_scope.h"
#include "collectives/options.h"
#include "collectives/pipeline.h"

namespace zcoll {
namespace {

constexpr int kRounds = 8;

void exchange(Communicator& comm, const void* send, void* recv, std::size_t bytes, int peer, bool send_first) {
  Request s, r;
  if (send_first) {
    s = comm.isend(send, bytes, peer, detail::kTagClock);
    comm.wait(s);
    r = comm.irecv(recv, bytes, peer, detail::kTagClock);
    comm.wait(r);
  } else {
    r = comm.irecv(recv, bytes, peer, detail::kTagClock);
    comm.wait(r);
    s = comm.isend(send, bytes, peer, detail::kTagClock);
    comm.wait(s);
  }
}

// offsets[r] = clock_r - clock_0 (ns), on rank 0; zeros elsewhere.
std::vector<std::int64_t> clock_offsets(Communicator& comm) {
  const int p = comm.size();
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(p), 0);
  if (comm.rank() == 0) {
    for (int r = 1; r < p; ++r) {
      if (comm.shares_clock(r)) continue;
      std::int64_t best_rtt = std::numeric_limits<std::int64_t>::max();
      for (int k = 0; k < kRounds; ++k) {
        std::int64_t ping[2] = {fine_ns(), 0}, pong[2] = {0, 0};
        exchange(comm, ping, pong, sizeof ping, r, true);
        const std::int64_t t3 = fine_ns();
        const std::int64_t rtt = (t3 - ping[0]) - (pong[1] - pong[0]);
        if (rtt < best_rtt) {
          best_rtt = rtt;
          offsets[static_cast<std::size_t>(r)] = ((pong[0] - ping[0]) + (pong[1] - t3)) / 2;
        }
      }
    }
  } else if (!comm.shares_clock(0)) {
    for (int k = 0; k < kRounds; ++k) {
      std::int64_t ping[2] = {0, 0}, pong[2] = {0, 0};
      Request r = comm.irecv(ping, sizeof ping, 0, detail::kTagClock);
      comm.wait(r);
      pong[0] = fine_ns();
      pong[1] = fine_ns();
      Request s = comm.isend(pong, sizeof pong, 0, detail::kTagClock);
      comm.wait(s);
    }
  }
  return offsets;
}

}  // namespace

std::vector<std::int64_t> gather_link_stats(Communicator& comm, bool reset) {
  const int p = comm.size();
  const std::size_t n = link_stats_row_length(p);
  LinkTelemetry& t = comm.telemetry();
  std::vector<std::int64_t> mine(n, 0), all(n * static_cast<std::size_t>(p), 0);
  t.row(mine.data());  // before anything below is sent
  const bool was_on = t.enabled();
  t.set_enabled(false);
  try {
    const detail::CallScope scope(comm, {"link_stats", n, DType::kInt64});
    const std::vector<std::int64_t> offsets = clock_offsets(comm);
    std::copy(offsets.begin(), offsets.end(), mine.begin() + LinkTelemetry::kHead);
    allgather(comm, mine.data(), all.data(), n, DType::kInt64);
  } catch (...) {
    t.set_enabled(was_on);
    throw;
  }
  t.set_enabled(was_on);
  if (reset) t.reset();
  return all;
}

}  // namespace zcoll
