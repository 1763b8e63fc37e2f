#include "comm/flight_recorder.h"

#include <time.h>

#include <cstdarg>
#include <cstdio>

namespace zcoll {
namespace {

std::int64_t wall_us() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

const char* state_name(int s) {
  switch (static_cast<CallState>(s)) {
    case CallState::kPosted: return "posted";
    case CallState::kInProgress: return "in_progress";
    case CallState::kDone: return "done";
    case CallState::kFailed: return "failed";
  }
  return "unknown";
}

// The names are zcoll's own literals: no character needs escaping.
void append(std::string& out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void append(std::string& out, const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  if (n > 0) out.append(buf, static_cast<std::size_t>(n) < sizeof buf ? static_cast<std::size_t>(n) : sizeof buf - 1);
}

}  // namespace

FlightRecorder::FlightRecorder(std::size_t capacity) : records_(capacity) {}

void FlightRecorder::begin(const CallDescription& call) {
  if (records_.empty() || !enabled_) return;
  const std::uint64_t n = calls_.load(std::memory_order_relaxed);
  Record& r = records_[n % records_.size()];
  r.version.add(1);  // odd: being rewritten
  std::atomic_thread_fence(std::memory_order_release);
  r.seq.set(call.seq);
  r.count.set(call.count);
  r.bytes.set(call.bytes);
  r.collective.set(call.collective);
  r.algorithm.set(call.algorithm);
  r.dtype.set(call.dtype);
  r.op.set(call.op);
  r.root.set(call.root);
  r.state.set(static_cast<int>(CallState::kPosted));
  r.waiting_for.set(-1);
  r.peers_used.set(0);
  r.start_us.set(wall_us());
  r.end_us.set(0);
  for (Peer& p : r.peers) {
    p.rank.set(-1);
    p.sent_posted.set(0);
    p.sent_done.set(0);
    p.received_posted.set(0);
    p.received_done.set(0);
  }
  std::atomic_thread_fence(std::memory_order_release);
  r.version.add(1);  // even: consistent
  calls_.store(n + 1, std::memory_order_release);
  current_ = &r;
}

void FlightRecorder::end(bool failed) {
  if (!current_) return;
  current_->state.set(static_cast<int>(failed ? CallState::kFailed : CallState::kDone));
  current_->waiting_for.set(-1);
  current_->end_us.set(wall_us());
  current_ = nullptr;
}

void FlightRecorder::count(int peer, std::uint64_t bytes, bool send, bool done) {
  Record& r = *current_;
  if (!done && r.state.get() == static_cast<int>(CallState::kPosted))
    r.state.set(static_cast<int>(CallState::kInProgress));
  const int used = r.peers_used.get();
  Peer* p = &r.peers[kMaxPeers];  // the overflow entry
  for (int i = 0; i < used; ++i)
    if (r.peers[i].rank.get() == peer) {
      p = &r.peers[i];
      break;
    }
  if (p == &r.peers[kMaxPeers] && used < kMaxPeers) {
    p = &r.peers[used];
    p->rank.set(peer);
    r.peers_used.set(used + 1);
  }
  (send ? (done ? p->sent_done : p->sent_posted) : (done ? p->received_done : p->received_posted)).add(bytes);
}

std::string FlightRecorder::json_calls() const {
  std::string out = "[";
  const std::uint64_t n = calls_.load(std::memory_order_acquire);
  const std::uint64_t cap = records_.size();
  const std::uint64_t first = n > cap ? n - cap : 0;
  bool any = false;
  for (std::uint64_t i = first; i < n; ++i) {
    const Record& r = records_[i % cap];
    const std::uint64_t v1 = r.version.get();
    std::atomic_thread_fence(std::memory_order_acquire);
    std::string one;
    append(one, "{\"seq\": %llu, \"collective\": \"%s\", \"algorithm\": \"%s\", \"dtype\": \"%s\", \"op\": \"%s\", ",
           static_cast<unsigned long long>(r.seq.get()), r.collective.get(), r.algorithm.get(), r.dtype.get(),
           r.op.get());
    append(one, "\"count\": %llu, \"bytes\": %llu, \"root\": %d, \"state\": \"%s\", \"waiting_for\": %d, ",
           static_cast<unsigned long long>(r.count.get()), static_cast<unsigned long long>(r.bytes.get()),
           r.root.get(), state_name(r.state.get()), r.waiting_for.get());
    const std::int64_t end = r.end_us.get();
    if (end)
      append(one, "\"start\": %.6f, \"end\": %.6f, \"peers\": [", r.start_us.get() / 1e6, end / 1e6);
    else
      append(one, "\"start\": %.6f, \"end\": null, \"peers\": [", r.start_us.get() / 1e6);
    const int used = r.peers_used.get();
    bool first_peer = true;
    for (int k = 0; k <= kMaxPeers; ++k) {
      if (k >= used && k != kMaxPeers) continue;
      const Peer& p = r.peers[k];
      const std::uint64_t sp = p.sent_posted.get(), sd = p.sent_done.get();
      const std::uint64_t rp = p.received_posted.get(), rd = p.received_done.get();
      if (k == kMaxPeers && sp + rp == 0) continue;
      append(one, "%s{\"rank\": %d, \"sent\": [%llu, %llu], \"received\": [%llu, %llu]}", first_peer ? "" : ", ",
             k == kMaxPeers ? -1 : p.rank.get(), static_cast<unsigned long long>(sp),
             static_cast<unsigned long long>(sd), static_cast<unsigned long long>(rp),
             static_cast<unsigned long long>(rd));
      first_peer = false;
    }
    one += "]}";
    std::atomic_thread_fence(std::memory_order_acquire);
    if ((v1 & 1) || r.version.get() != v1) continue;  // caught being rewritten
    out += any ? ",\n  " : "\n  ";
    out += one;
    any = true;
  }
  out += any ? "\n]" : "]";
  return out;
}

}  // namespace zcoll
