// The engine that every segmented point-to-point schedule (ring, recursive doubling,
// halving-doubling) runs on.
//
// A schedule is a sequence of units. Unit u sends one segment to `dst` and receives one
// segment from `src`, either straight into its final place (recv_into) or into one of `depth`
// scratch slots, after which on_received(u, data) combines it (reduces it into the output).
//
//   1. post the receives of units 0 .. depth-1
//   2. for each unit u in order: post its send; wait for its receive (and for its send, if
//      the result overwrites what it sends); on_received(u);
//      post the receive of unit u + depth into the slot just freed
//   3. wait for all sends
//
// The send of unit u may read anything produced by units < u, so a schedule only has to list
// its units in dependency order. Receives posted `depth` ahead let the transfer of the next
// segments overlap the reduction of this one, and slots of one segment keep the received data
// in cache while it is reduced.
#pragma once
#include <cstddef>
#include <algorithm>

#include "collectives/options.h"
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

struct Unit {
  const void* send = nullptr;
  std::size_t send_bytes = 0;
  int dst = -1;
  void* recv_into = nullptr;  // null: receive into a scratch slot and call on_received
  std::size_t recv_bytes = 0;
  int src = -1;
  // on_received overwrites the memory this unit sends (recursive doubling): wait for the send
  // to finish before combining.
  bool send_overlaps_result = false;
};

// Schedule: `Unit unit(std::size_t u)` and `void on_received(std::size_t u, const void* data)`.
template <typename Schedule>
void run_pipeline(Communicator& comm, Schedule& schedule, std::size_t num_units,
                  std::size_t max_recv_bytes, const PipelineOptions& options, int tag) {
  if (num_units == 0) return;
  constexpr std::size_t kMaxDepth = 16;
  const std::size_t depth = std::min<std::size_t>(pipeline_depth(options), kMaxDepth);
  auto* slots = static_cast<unsigned char*>(comm.scratch(depth * max_recv_bytes, /*slot=*/0));
  // Fixed-size rings instead of containers: a small message must not pay for allocations.
  Request recvs[kMaxDepth];
  void* recv_ptr[kMaxDepth] = {};
  Request sends[2 * kMaxDepth];
  std::size_t sends_begin = 0, sends_end = 0;  // ring of outstanding sends
  Request overlapping_send;

  auto post_recv = [&](std::size_t u) {
    if (u >= num_units) return;
    const Unit unit = schedule.unit(u);
    const std::size_t s = u % depth;
    recv_ptr[s] = unit.recv_into ? unit.recv_into : slots + s * max_recv_bytes;
    if (unit.recv_bytes == 0) return;
    ZCOLL_CHECK_LE(unit.recv_bytes, max_recv_bytes, "segment larger than its slot");
    recvs[s] = comm.irecv(recv_ptr[s], unit.recv_bytes, unit.src, tag);
  };

  for (std::size_t u = 0; u < depth; ++u) post_recv(u);
  for (std::size_t u = 0; u < num_units; ++u) {
    const Unit unit = schedule.unit(u);
    if (unit.send_bytes) {
      Request r = comm.isend(unit.send, unit.send_bytes, unit.dst, tag);
      if (unit.send_overlaps_result) {
        overlapping_send = r;
      } else {
        if (sends_end - sends_begin == 2 * depth) comm.wait(sends[sends_begin++ % (2 * depth)]);
        sends[sends_end++ % (2 * depth)] = r;
      }
    }
    const std::size_t s = u % depth;
    comm.wait(recvs[s]);
    comm.wait(overlapping_send);
    if (unit.recv_bytes && !unit.recv_into) schedule.on_received(u, recv_ptr[s]);
    post_recv(u + depth);
  }
  while (sends_begin != sends_end) comm.wait(sends[sends_begin++ % (2 * depth)]);
}

// Tags keep the phases of one call apart; calls on one communicator are ordered, so
// messages of consecutive calls cannot be confused either.
enum Tag : int {
  kTagRingReduceScatter = 100,
  kTagRingAllgather,
  kTagRecursiveDoubling,
  kTagFoldIn,
  kTagFoldOut,
  kTagHalving,
  kTagDoubling,
  kTagTreeReduce,
  kTagTreeBroadcast,
  kTagBarrier,
  kTagCheck,
  kTagSparsePairs,
};

}  // namespace zcoll::detail
