#include "comm/telemetry.h"

namespace zcoll {

void LinkTelemetry::resize(int ranks) {
  peers_.assign(static_cast<std::size_t>(ranks), Peer{});
  reset();
}

void LinkTelemetry::reset() {
  for (Peer& p : peers_) p = Peer{};
  calls_ = arrival_sum_ = duration_sum_ = 0;
  arrived_ns_ = -1;
  base_ns_ = fine_ns();
}

void LinkTelemetry::row(std::int64_t* out) const {
  out[0] = base_ns_;
  out[1] = calls_;
  out[2] = arrival_sum_;
  out[3] = duration_sum_;
  std::int64_t* p = out + kHead + peers_.size();  // after the clock offsets' place
  for (const Peer& peer : peers_) {
    p[0] = peer.sent_bytes;
    p[1] = peer.sends;
    p[2] = peer.send_post_sum;
    p[3] = peer.recv_bytes;
    p[4] = peer.recvs;
    p[5] = peer.recv_done_sum;
    p += kPerPeer;
  }
}

}  // namespace zcoll
