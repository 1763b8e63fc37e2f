// The engine every point-to-point schedule runs on: ring, tree, recursive doubling,
// halving-doubling, the fold steps, the compressed ring, top-k, the sparse allgatherv, the
// barrier and the check-mode header exchange. No algorithm calls isend/irecv/wait itself, so
// whatever wants to see every message (traffic counters today; telemetry, deadlines and traces
// next) is written once, in `Channel` below.
//
// A schedule is a sequence of units. Unit u sends up to kMaxPeers messages and receives up to
// kMaxPeers messages, each received either straight into its final place (Transfer::buf set) or
// into one of the engine's scratch slots, after which on_received(u, slots) combines it.
//
//   1. post the receives of units 0 .. depth-1
//   2. for each unit u in order:
//        before_send(u)        (lazy work the sends need: encode, select)
//        post its sends        (at most 2 * depth * kMaxPeers sends stay outstanding: back-pressure)
//        wait for its receives (and for its sends first when `wait_sends_first`)
//        on_received(u, slots) (combine; called for every unit, with or without slot receives)
//        post the receives of unit u + depth into the slots just freed
//   3. wait for every send
//
// The sends of unit u may read anything produced by units < u, so a schedule only has to list
// its units in dependency order; to let a rank compute while its next messages are on the wire,
// a schedule pairs the send of message v with the receive of message v - skew (the compressed
// ring and top-k do). Receives posted `depth` ahead let the transfer of the next segments overlap
// the reduction of this one; slots of one segment keep the received data in cache.
//
// Schedule interface (derive from ScheduleBase for the defaults):
//   std::size_t num_units() const;
//   std::size_t max_recv_bytes() const;      // the largest receive that lands in a slot
//   Unit unit(std::size_t u) const;          // pure: may be called more than once per unit
//   void before_send(std::size_t u);         // once per unit, in order
//   void on_received(std::size_t u, const Slots& slots);   // once per unit, in order
#pragma once
#include <algorithm>
#include <cstddef>

#include "collectives/options.h"
#include "comm/backoff.h"
#include "comm/communicator.h"
#include "common/check.h"

namespace zcoll::detail {

struct Range {
  std::size_t begin = 0;
  std::size_t count = 0;
};

// Part i of `parts` near-equal parts of [begin, begin + count).
inline Range split(Range whole, std::size_t parts, std::size_t i) {
  const std::size_t b = whole.count * i / parts;
  const std::size_t e = whole.count * (i + 1) / parts;
  return Range{whole.begin + b, e - b};
}

// Number of segments so that no segment of a `count`-element block exceeds the segment size.
inline std::size_t num_segments(std::size_t count, std::size_t elem_size, const PipelineOptions& o) {
  const std::size_t seg = o.max_segment_bytes ? o.max_segment_bytes : default_segment_bytes();
  const std::size_t seg_elems = seg / elem_size ? seg / elem_size : 1;
  const std::size_t n = (count + seg_elems - 1) / seg_elems;
  return n ? n : 1;
}

// a mod p in [0, p), for rank arithmetic around a ring.
inline int mod(int a, int p) { return ((a % p) + p) % p; }

inline int pipeline_depth(const PipelineOptions& o) { return o.depth > 0 ? o.depth : default_pipeline_depth(); }

// Message tags: one per phase, so the phases of one call never match each other's messages.
// Calls on one communicator are ordered (every rank issues them in the same order) and MPI keeps
// the order of messages between a pair with one tag, so consecutive calls cannot be confused
// either. Every tag of zcoll lives here.
enum Tag : int {
  kTagRingReduceScatter = 100,  // ring reduce-scatter steps (and the fused ring allreduce)
  kTagRingAllgather,            // ring allgather steps, allgatherv
  kTagRecursiveDoubling,
  kTagFoldIn,                   // the pre/post steps of non-powers of two (fold.h)
  kTagFoldOut,
  kTagHalving,
  kTagDoubling,
  kTagTreeReduce,
  kTagTreeBroadcast,
  kTagBarrier,
  kTagCheck,                    // the check-mode header exchange (check_args.cc)
  kTagSparsePairs,              // top-k (index, value) blocks
  kTagCompressedRing,           // compressed ring payloads
  kTagHierarchical,             // the hierarchical allreduce (both lanes) and its node sums
  kTagClock,                    // link_stats' clock-offset ping-pong (link_stats.cc)
  // Algorithms registered at run time (register_allreduce_algorithm, algorithm_table.h) take
  // tags from here up, so they never match a built-in's messages.
  kTagUser = 1000,
};

// Up to two peers per unit: what a binary tree needs (two children); every other schedule uses one.
inline constexpr int kMaxPeers = 2;

struct Transfer {
  const void* buf = nullptr;  // send: the bytes to send; receive: where they land (null: a slot)
  std::size_t bytes = 0;      // 0: no message
  int peer = -1;
};

struct Unit {
  Transfer send[kMaxPeers];
  Transfer recv[kMaxPeers];
  // on_received overwrites what this unit sends (recursive doubling): wait for the sends first.
  bool wait_sends_first = false;

  // The common case: one send to dst and one receive from src (recv_into null: into a slot).
  static Unit exchange(const void* send_buf, std::size_t send_bytes, int dst, void* recv_into,
                       std::size_t recv_bytes, int src) {
    Unit u;
    u.send[0] = {send_buf, send_bytes, dst};
    u.recv[0] = {recv_into, recv_bytes, src};
    return u;
  }
};

// Where the slot receives of a unit landed: data[i] for recv[i]; null unless recv[i] is a
// non-empty receive into a slot.
struct Slots {
  const void* data[kMaxPeers] = {};
};

struct ScheduleBase {
  void before_send(std::size_t) {}
  void on_received(std::size_t, const Slots&) {}
};

// Every message of every schedule passes here: the one place that sees peer, bytes and tag, and
// reports each message to the flight recorder (comm/flight_recorder.h) and the link telemetry
// (comm/telemetry.h: sends when posted, receives when complete). Waits end at the call's
// deadline inside the transport (comm/watchdog.h).
class Channel {
 public:
  Channel(Communicator& comm, int tag) : comm_(comm), tag_(tag) {}
  Request send(const Transfer& t) { return posted(comm_.isend(t.buf, t.bytes, t.peer, tag_), t.bytes, true); }
  Request recv(void* buf, const Transfer& t) { return posted(comm_.irecv(buf, t.bytes, t.peer, tag_), t.bytes, false); }
  void complete(Request& r) {
    if (!r.active) return;
    comm_.recorder().waiting_for(r.peer);
    comm_.wait(r);
    completed(r);
  }
  // Waits for `r`; with the telemetry on, notes the other posted receives `recvs[0..n)` as they
  // complete meanwhile. A rank held up by one slow link (a send that drains slowly, a receive
  // that arrives late) would otherwise see its other incoming messages only when it gets back to
  // them, and their links would look slow too.
  // Only receives from other peers are watched (one peer's messages complete in order), so a
  // ring, whose receives all come from one peer, waits in the transport as without telemetry.
  void complete_watching(Request& r, Request* recvs, std::size_t n) {
    if (!r.active) return;
    auto watched = [&](const Request& o) { return &o != &r && o.active && o.peer != r.peer; };
    if (!comm_.telemetry().enabled() || std::none_of(recvs, recvs + n, watched)) return complete(r);
    comm_.recorder().waiting_for(r.peer);
    Backoff backoff(comm_.oversubscribed());
    while (!comm_.test(r)) {
      for (std::size_t i = 0; i < n; ++i)
        if (watched(recvs[i]) && comm_.test(recvs[i])) completed(recvs[i]);
      backoff.pause();
      comm_.watchdog().poll(r.peer);
    }
    completed(r);
  }
  void cancel(Request& r) noexcept { comm_.cancel(r); }
  Communicator& comm() { return comm_; }

 private:
  void completed(const Request& r) {
    comm_.recorder().completed(r.peer, r.bytes, r.send);
    if (!r.send) comm_.telemetry().received(r.peer, r.bytes);
  }
  Request posted(Request r, std::size_t bytes, bool send) {
    r.bytes = bytes;
    r.send = send;
    comm_.recorder().posted(r.peer, bytes, send);
    if (send) comm_.telemetry().sent(r.peer, bytes);
    return r;
  }

  Communicator& comm_;
  int tag_;
};

template <typename Schedule>
void run_pipeline(Communicator& comm, Schedule& schedule, const PipelineOptions& options, Tag tag) {
  const std::size_t num_units = schedule.num_units();
  if (num_units == 0) return;
  constexpr std::size_t kMaxDepth = 16;
  constexpr std::size_t kMaxSends = 2 * kMaxDepth * kMaxPeers;
  const std::size_t depth = std::min<std::size_t>(pipeline_depth(options), kMaxDepth);
  const std::size_t max_recv = schedule.max_recv_bytes();
  auto* slot_memory =
      static_cast<unsigned char*>(comm.scratch(depth * kMaxPeers * max_recv, Scratch::kPipelineSlots));
  Channel channel(comm, tag);
  // Fixed-size rings instead of containers: a small message must not pay for allocations.
  Request recvs[kMaxDepth][kMaxPeers];
  Slots slots[kMaxDepth];
  Request sends[kMaxSends];
  std::size_t sends_begin = 0, sends_end = 0;  // ring of outstanding sends
  const std::size_t send_window = 2 * depth * kMaxPeers;

  auto post_recvs = [&](std::size_t u) {
    if (u >= num_units) return;
    const Unit unit = schedule.unit(u);
    const std::size_t s = u % depth;
    for (int i = 0; i < kMaxPeers; ++i) {
      const Transfer& t = unit.recv[i];
      void* slot = slot_memory + (s * kMaxPeers + i) * max_recv;
      slots[s].data[i] = t.bytes && !t.buf ? slot : nullptr;
      if (t.bytes == 0) continue;
      if (!t.buf) ZCOLL_CHECK_LE(t.bytes, max_recv, "a receive larger than its slot");
      recvs[s][i] = channel.recv(t.buf ? const_cast<void*>(t.buf) : slot, t);
    }
  };
  auto wait_sends = [&](std::size_t keep) {
    while (sends_end - sends_begin > keep)
      channel.complete_watching(sends[sends_begin++ % kMaxSends], &recvs[0][0], depth * kMaxPeers);
  };

  try {
    for (std::size_t u = 0; u < depth; ++u) post_recvs(u);
    for (std::size_t u = 0; u < num_units; ++u) {
      schedule.before_send(u);
      const Unit unit = schedule.unit(u);
      for (const Transfer& t : unit.send) {
        if (t.bytes == 0) continue;
        wait_sends(send_window - 1);
        sends[sends_end++ % kMaxSends] = channel.send(t);
      }
      if (unit.wait_sends_first) wait_sends(0);
      const std::size_t s = u % depth;
      for (Request& r : recvs[s]) channel.complete_watching(r, &recvs[0][0], depth * kMaxPeers);
      schedule.on_received(u, slots[s]);
      post_recvs(u + depth);
    }
    wait_sends(0);
  } catch (...) {
    // A failed call (a peer lost, a deadline, a bad message): nothing it posted may write into
    // the caller's buffers later or be matched by a later call.
    for (auto& unit_recvs : recvs)
      for (Request& r : unit_recvs) channel.cancel(r);
    for (Request& r : sends) channel.cancel(r);
    throw;
  }
}

}  // namespace zcoll::detail
