// Link telemetry: per peer and per rank timing of real work, cheap enough to leave on
// (ZCOLL_TELEMETRY, on by default), read by comm.link_stats() and comm.diagnose().
//
// What is recorded (aggregates, not a log):
//   per call:            the arrival time (entry into the collective) and the time in it,
//                        summed, and the count;
//   per message sent:    bytes, count, and the sum of the times the sends were posted;
//   per message received: bytes, count, and the sum of the times the receives completed.
// Every time is CLOCK_MONOTONIC in ns (comm/clock.h), relative to `base_ns`, the time of the
// last reset, so the sums fit 64 bits. One clock read per message and per call.
//
// Why sums of post and completion times: with a time base common to both ends (one machine
// shares CLOCK_MONOTONIC; across machines link_stats measures each rank's offset to rank 0 by
// ping-pong first), the sum over a window of (completion at j - post at i) of the messages
// i -> j is  sum_recv_done[j][i] - sum_send_post[i][j]:  the total time the link's messages
// spent in flight, from two per-rank aggregates, with no per-message log and no matching. It
// counts waiting behind earlier messages of the same link, which is what makes a slow link
// stand out: its messages queue. The mean per-rank arrival time does the same for late ranks.
// Receive completion is observed when the engine waits for it, so a receiver that was busy
// elsewhere adds its delay to its incoming links; docs/diagnose.md says what that means.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/call_stats.h"
#include "comm/clock.h"

namespace zcoll {

class LinkTelemetry {
 public:
  explicit LinkTelemetry(bool on) : on_(on) {}
  bool enabled() const { return on_; }
  void set_enabled(bool on) { on_ = on; }
  void resize(int ranks);  // at creation, once the size is known; resets
  void reset();

  void arrived() {
    if (!on_) return;
    arrived_ns_ = fine_ns() - base_ns_;
    arrival_sum_ += arrived_ns_;
    ++calls_;
  }
  // The call (its collective, the algorithm that ran, this rank's input bytes) leaves; it is
  // also counted in calls() (comm/call_stats.h).
  void left(const char* collective, const char* algorithm, std::uint64_t bytes) {
    if (on_ && arrived_ns_ >= 0) {
      const std::int64_t ns = fine_ns() - base_ns_ - arrived_ns_;
      duration_sum_ += ns;
      calls_by_kind_.record(collective, algorithm, bytes, ns);
    }
    arrived_ns_ = -1;
  }
  // Per (collective, algorithm, size class) counters since creation (not reset by reset()).
  const CallStats& calls() const { return calls_by_kind_; }
  void sent(int peer, std::uint64_t bytes) {
    if (!on_) return;
    Peer& p = peers_[static_cast<std::size_t>(peer)];
    p.sent_bytes += static_cast<std::int64_t>(bytes);
    ++p.sends;
    p.send_post_sum += fine_ns() - base_ns_;
  }
  void received(int peer, std::uint64_t bytes) {
    if (!on_) return;
    Peer& p = peers_[static_cast<std::size_t>(peer)];
    p.recv_bytes += static_cast<std::int64_t>(bytes);
    ++p.recvs;
    p.recv_done_sum += fine_ns() - base_ns_;
  }

  // This rank's row for comm.link_stats() (collectives/link_stats.h): base_ns, calls,
  // arrival_sum, duration_sum, p values left for clock offsets, then per peer j: sent_bytes,
  // sends, send_post_sum, recv_bytes, recvs, recv_done_sum (kPerPeer values).
  static constexpr int kHead = 4;
  static constexpr int kPerPeer = 6;
  void row(std::int64_t* out) const;

 private:
  struct Peer {
    std::int64_t sent_bytes = 0, sends = 0, send_post_sum = 0;
    std::int64_t recv_bytes = 0, recvs = 0, recv_done_sum = 0;
  };
  bool on_;
  std::int64_t base_ns_ = 0;
  std::int64_t calls_ = 0, arrival_sum_ = 0, duration_sum_ = 0;
  std::int64_t arrived_ns_ = -1;  // the current call's arrival (-1: none)
  std::vector<Peer> peers_;
  CallStats calls_by_kind_;
};

}  // namespace zcoll
