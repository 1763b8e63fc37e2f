// Shared-memory allreduce: all ranks on one node reduce through a shared window instead of
// messages (the transport's SharedArena, MPI_Win_allocate_shared for MPI).
//
// Purpose: skip the transport's copies. MPI point-to-point on one node copies every byte
//          through its own buffers; here each byte is copied into shared memory once, reduced
//          where it lies, and copied out once.
// Layout:  each rank's region holds two staging buffers (B bytes) and two result buffers
//          (B/p bytes); iteration s uses pair s % 2 so that one iteration's copies overlap the
//          next one's reads.
// Phases, per block of B bytes (iteration s):
//          1. stage: copy the other ranks' sub-blocks of my input into my staging buffer;
//             publish flag STAGED = s;
//          2. reduce: when every rank has staged, reduce sub-block `rank` over all ranks in rank
//             order (my own contribution read from `in`) into my result buffer (divided by p for
//             avg); publish REDUCED = s. One rank reduces each element, in one fixed order, so
//             every rank ends with the same bits;
//          3. gather: when every rank has reduced, copy every rank's result into `out`; publish
//             GATHERED = s.
//          Before reusing pair s % 2, a rank waits until everyone has finished reading it
//          (REDUCED >= s-2 for staging, GATHERED >= s-2 for results).
// Small messages (up to kDirectBytes) skip a synchronisation: every rank stages its whole
// input, then every rank reduces the whole buffer from all staging areas in rank order
// (identical inputs and order, so identical bits), straight into `out`.
// Cost:    3 flag synchronisations per block (2 for small messages); per rank (p-1)/p S copied
//          in, S read and S/p written by the reduction, S copied out: about 2 S of memory traffic
//          beyond the reduction itself, against about 4 S for a ring over MPI messages. As a model, with
//          alpha a flag synchronisation and beta a byte copied through memory:
//          3 alpha + 2 S beta + (p-1)/p S gamma.
// Single copy, for calls of at least SharedArena::single_copy_bytes (256 KiB) where the
// transport lets ranks read each other's memory (SharedArena::peer_memory; process_vm_readv over
// MPI), in one iteration whatever the size:
//          0. post the addresses of `in` and `out` (flag slots), publish STAGED = s;
//          1. reduce: when every rank has posted, reduce sub-block `rank` of the whole call in
//             rank order, piece by piece (cache-sized, or the pipeline's segment when smaller):
//             the other ranks' pieces are read from their `in` into a private buffer, mine from
//             `in`. From kStreamBytes a piece is summed in a private buffer and copied into `out`
//             with non-temporal stores: `out` is then written without being read first, and a
//             result that large leaves the cache anyway (2 ranks, 64 MiB: 0.86-0.92 of the time,
//             three A/B runs; 16 MiB: 0.94-1.04). Where the transport also lets ranks write each
//             other's memory (SharedArena::peer_writes; process_vm_writev), each reduced piece is
//             written, while still in cache, into the other ranks' `out` too. Publish REDUCED = s;
//          2. gather, only without peer writes: for each other rank, once it has reduced, read
//             its sub-block of its `out` into mine (one copy, memory to memory); GATHERED = s;
//          3. wait until every rank has reduced (with peer writes: they write into my `out`
//             until then) or gathered (without: they read my `in` and `out` until then).
//          Same reduction order as the staged path, so the same bits. In place is safe: sub-block
//          r of every rank's buffer is read and written by rank r alone (with peer writes: each
//          piece read from every rank before it is written to any), or written by its owner in
//          step 2 after rank r has read it (REDUCED).
// Cost:    3 alpha + 2 (p-1)/p S beta + (p-1)/p S gamma: (p-1)/p S read from the other ranks
//          into cache for the reduction and (p-1)/p S copied for the gather, nothing staged.
//          Peer writes copy the same bytes but from cache: per rank S read from memory and S
//          written (2 ranks), as the copy of S does, against 1.5 S read (plus reads for
//          ownership) when gathering (2 ranks, 16-64 MiB: 0.90-0.98 of the time, two A/B runs).
// Input through the window, 2 ranks with peer writes, single-copy calls below
// SharedArena::window_in_bytes whose half fits a staging buffer: 1. copy the half of `in` the
// peer reduces into my staging buffer (pair s % 2, as the staged path), post `out`, publish
// STAGED = s; 2. reduce my half from `in` and the peer's staging buffer, in rank order, into
// `out`, each piece then written into the peer's `out`; publish REDUCED = s; 3. wait for the
// peer's REDUCED. The owner's copy from its own cache replaces the peer's process_vm_readv of
// it (a kernel copy, page pins): faster on just-written and on evicted inputs, slower on one
// hot buffer pair reused (figures at window_in_bytes). Same order, so the same bits; in place is
// safe: the half the peer reduces is copied out before STAGED, and written only after it.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "collectives/algorithms.h"
#include "collectives/pipeline.h"
#include "common/check.h"
#include "kernels/reduce.h"

namespace zcoll {
namespace {

enum Flag : int { kStaged = 0, kReduced = 1, kGathered = 2, kInAddress = 3, kOutAddress = 4 };

constexpr std::size_t kDirectBytes = 32 * 1024;
// Single copy: private buffers for the other ranks' pieces (and a running sum beyond 2 ranks),
// sized to stay in a core's L2 cache.
constexpr std::size_t kScratchBytes = 256 * 1024;
// Single copy: calls of at least this many bytes write their reduced pieces into `out` with
// non-temporal stores (this machine's L3; below it the result may still be in cache when read).
constexpr std::size_t kStreamBytes = 8 * 1024 * 1024;

// memcpy with non-temporal stores where the ISA has them: the destination's lines are written
// without being read first (no read-for-ownership), halving the memory traffic of the write.
void copy_streaming(unsigned char* dst, const unsigned char* src, std::size_t bytes) {
#if defined(__SSE2__)
  const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  dst += head, src += head, bytes -= head;
  const std::size_t vectors = bytes / 16;
  auto* d = reinterpret_cast<__m128i*>(dst);
  const auto* v = reinterpret_cast<const __m128i*>(src);
  for (std::size_t i = 0; i < vectors; ++i) _mm_stream_si128(d + i, _mm_loadu_si128(v + i));
  std::memcpy(dst + vectors * 16, src + vectors * 16, bytes - vectors * 16);
  _mm_sfence();  // the stores are visible before REDUCED is published
#else
  std::memcpy(dst, src, bytes);
#endif
}

struct Layout {
  std::size_t block_elems;   // elements per iteration (the staging buffer's capacity)
  std::size_t staging_bytes;
  std::size_t result_bytes;

  Layout(std::size_t region_bytes, std::size_t es, int p) {
    // Two (staging, result) pairs with result = staging / p (+ rounding room) in region_bytes.
    const std::size_t pair = region_bytes / 2 - 256;
    block_elems = (pair * static_cast<std::size_t>(p) / static_cast<std::size_t>(p + 1)) / es;
    block_elems -= block_elems % 16;
    staging_bytes = (block_elems * es + 63) / 64 * 64;
    result_bytes = ((block_elems / p + 1) * es + 63) / 64 * 64;
  }
  unsigned char* staging(const SharedArena& a, int rank, int pair) const {
    return a.data(rank) + pair * (staging_bytes + result_bytes);
  }
  unsigned char* result(const SharedArena& a, int rank, int pair) const {
    return staging(a, rank, pair) + staging_bytes;
  }
};

// One call's view of the arena: the block loop's two kinds of iteration.
struct ShmCall {
  SharedArena& arena;
  const Layout& layout;
  const unsigned char* src;
  unsigned char* dst;
  DType dtype;
  ReduceOp op;
  int p, me;
  std::size_t es;
  // Traffic counter: the bytes other ranks read from this rank's region (staged sub-blocks,
  // then this rank's results), 2(p-1)/p S like a ring; (p-1) S for a one-shot block.
  std::uint64_t& bytes_sent;

  // Every rank stages the whole block and reduces all of it, in rank order, into `out`.
  void direct(const detail::Range& block, std::uint64_t s, int pair) {
    unsigned char* staging = layout.staging(arena, me, pair);
    bytes_sent += static_cast<std::uint64_t>(p - 1) * block.count * es;
    std::memcpy(staging, src + block.begin * es, block.count * es);
    arena.publish(me, kStaged, s);
    arena.wait_all(kStaged, s);
    if (s > 2) arena.wait_all(kGathered, s - 2);  // the result buffers are not used here
    unsigned char* target = dst + block.begin * es;
    kernels::reduce(target, layout.staging(arena, 0, pair), layout.staging(arena, 1, pair), block.count,
                    dtype, op);
    for (int r = 2; r < p; ++r)
      kernels::reduce(target, target, layout.staging(arena, r, pair), block.count, dtype, op);
    if (op == ReduceOp::kAvg) kernels::divide(target, block.count, dtype, p);
    arena.publish(me, kReduced, s);
    arena.publish(me, kGathered, s);
  }

  // Phases 1-3 of the file's comment.
  void staged(const detail::Range& block, std::uint64_t s, int pair) {
    auto sub = [&](int r) { return detail::split(detail::Range{0, block.count}, p, r); };
    unsigned char* staging = layout.staging(arena, me, pair);
    bytes_sent += 2 * static_cast<std::uint64_t>(p - 1) * block.count * es / p;
    // 1. stage (my own sub-block stays in `in`: only I read it)
    for (int r = 0; r < p; ++r) {
      if (r == me) continue;
      const detail::Range q = sub(r);
      std::memcpy(staging + q.begin * es, src + (block.begin + q.begin) * es, q.count * es);
    }
    arena.publish(me, kStaged, s);
    // 2. reduce my sub-block over all ranks, in rank order
    arena.wait_all(kStaged, s);
    if (s > 2) arena.wait_all(kGathered, s - 2);
    const detail::Range mine = sub(me);
    unsigned char* result = layout.result(arena, me, pair);
    auto contribution = [&](int r) -> const unsigned char* {
      return r == me ? src + (block.begin + mine.begin) * es
                     : layout.staging(arena, r, pair) + mine.begin * es;
    };
    if (mine.count) {
      kernels::reduce(result, contribution(0), contribution(1), mine.count, dtype, op);
      for (int r = 2; r < p; ++r) kernels::reduce(result, result, contribution(r), mine.count, dtype, op);
      if (op == ReduceOp::kAvg) kernels::divide(result, mine.count, dtype, p);
    }
    arena.publish(me, kReduced, s);
    // 3. gather every rank's result
    arena.wait_all(kReduced, s);
    for (int r = 0; r < p; ++r) {
      const detail::Range q = sub(r);
      std::memcpy(dst + (block.begin + q.begin) * es, layout.result(arena, r, pair), q.count * es);
    }
    arena.publish(me, kGathered, s);
  }
};

// The single-copy iteration (the file's comment, "Single copy").
struct SingleCopyCall {
  SharedArena& arena;
  PeerMemory& peers;
  const AllreduceArgs& a;
  int p, me;
  std::size_t es;
  CommStats& stats;

  const unsigned char* in() const { return static_cast<const unsigned char*>(a.in); }
  unsigned char* out() const { return static_cast<unsigned char*>(a.out); }
  const unsigned char* remote(int r, int slot) const {
    return reinterpret_cast<const unsigned char*>(static_cast<std::uintptr_t>(arena.posted(r, slot)));
  }
  unsigned char* remote_out(int r) const {
    return reinterpret_cast<unsigned char*>(static_cast<std::uintptr_t>(arena.posted(r, kOutAddress)));
  }
  detail::Range sub(int r) const { return detail::split(detail::Range{0, a.count}, p, r); }
  void read(int r, const unsigned char* remote_bytes, void* local, std::size_t bytes) {
    peers.read(r, remote_bytes, local, bytes);
    stats.bytes_read_from_peers += bytes;
  }
  void write(int r, unsigned char* remote_bytes, const void* local, std::size_t bytes) {
    peers.write(r, remote_bytes, local, bytes);
    stats.bytes_written_to_peers += bytes;
  }

  // The file's comment, "Input through the window": p == 2, peer writes allowed.
  void run_window_in(std::uint64_t s, unsigned char* my_staging, const unsigned char* peer_staging) {
    const int peer = 1 - me;
    const detail::Range theirs = sub(peer), mine = sub(me);
    std::memcpy(my_staging, in() + theirs.begin * es, theirs.count * es);
    arena.post(me, kOutAddress, reinterpret_cast<std::uintptr_t>(a.out));
    arena.publish(me, kStaged, s);
    stats.bytes_sent += static_cast<std::uint64_t>(theirs.count + mine.count) * es;
    arena.wait(peer, kStaged, s);
    const std::size_t cap = a.pipeline.max_segment_bytes ? a.pipeline.max_segment_bytes : kScratchBytes;
    const std::size_t piece = std::max<std::size_t>(1, std::min(cap, kScratchBytes / 2) / es);
    for (std::size_t b = 0; b < mine.count; b += piece) {
      const std::size_t n = std::min(piece, mine.count - b);
      unsigned char* const target = out() + (mine.begin + b) * es;
      const unsigned char* const own = in() + (mine.begin + b) * es;
      const unsigned char* const other = peer_staging + b * es;
      kernels::reduce(target, me == 0 ? own : other, me == 0 ? other : own, n, a.dtype, a.op);
      if (a.op == ReduceOp::kAvg) kernels::divide(target, n, a.dtype, p);
      write(peer, remote_out(peer) + (mine.begin + b) * es, target, n * es);
    }
    arena.publish(me, kReduced, s);
    arena.publish(me, kGathered, s);
    arena.wait(peer, kReduced, s);
  }

  void run(std::uint64_t s) {
    arena.post(me, kInAddress, reinterpret_cast<std::uintptr_t>(a.in));
    arena.post(me, kOutAddress, reinterpret_cast<std::uintptr_t>(a.out));
    arena.publish(me, kStaged, s);
    stats.bytes_sent += 2 * static_cast<std::uint64_t>(p - 1) * a.count * es / p;
    arena.wait_all(kStaged, s);
    if (arena.peer_writes) {
      // 1. reduce, each piece also written into every other rank's `out`; 2. nothing to gather
      reduce_mine(sub(me), true);
      arena.publish(me, kReduced, s);
      arena.publish(me, kGathered, s);
      arena.wait_all(kReduced, s);
      return;
    }
    reduce_mine(sub(me), false);
    arena.publish(me, kReduced, s);
    for (int k = 1; k < p; ++k) {
      const int r = (me + k) % p;  // staggered: the ranks do not all read one rank at once
      const detail::Range q = sub(r);
      arena.wait(r, kReduced, s);
      if (q.count) read(r, remote(r, kOutAddress) + q.begin * es, out() + q.begin * es, q.count * es);
    }
    arena.publish(me, kGathered, s);
    arena.wait_all(kGathered, s);
  }

  // out[mine] = c_0 + c_1 + ... + c_{p-1} in that order (divided by p for avg), where c_r is
  // rank r's `in`. Beyond two ranks a running sum in scratch, and from kStreamBytes the whole
  // sum there, so that `out` (which may be my `in`) is written only by the last step, after my
  // own piece was read.
  void reduce_mine(const detail::Range& mine, bool write_peers) {
    if (mine.count == 0) return;
    const std::size_t fetch_buffers = p == 2 ? 1 : 2;  // + 1 for the sum
    const std::size_t cap = a.pipeline.max_segment_bytes ? a.pipeline.max_segment_bytes : kScratchBytes;
    // the buffers a piece passes through (fetched, plus the sum where it is read again) fit in
    // kScratchBytes: 2 ranks writing peers with 256 KiB pieces (512 KiB of scratch, all of
    // this machine's L2) took 1.04-1.13x the time of 128 KiB pieces at 16-64 MiB
    const std::size_t buffers = p == 2 ? (write_peers ? 2 : 1) : 3;
    const std::size_t piece = std::max<std::size_t>(1, std::min(cap, kScratchBytes / buffers) / es);
    thread_local std::vector<unsigned char> scratch;
    if (scratch.size() < (fetch_buffers + 1) * piece * es) scratch.resize((fetch_buffers + 1) * piece * es);
    unsigned char* const fetched[2] = {scratch.data(), scratch.data() + (fetch_buffers - 1) * piece * es};
    unsigned char* const sum = scratch.data() + fetch_buffers * piece * es;
    const bool streaming = a.count * es >= kStreamBytes;
    for (std::size_t b = mine.begin; b < mine.begin + mine.count; b += piece) {
      const std::size_t n = std::min(piece, mine.begin + mine.count - b);
      int next = 0;  // which fetch buffer the next remote piece goes to
      auto contribution = [&](int r) -> const unsigned char* {
        if (r == me) return in() + b * es;
        unsigned char* buf = fetched[next];
        next ^= 1;
        read(r, remote(r, kInAddress) + b * es, buf, n * es);
        return buf;
      };
      // the last addition goes straight into `out` unless the result is streamed there
      unsigned char* const target = out() + b * es;
      unsigned char* const last = streaming ? sum : target;
      const unsigned char* c0 = contribution(0);
      if (p == 2) {
        kernels::reduce(last, c0, contribution(1), n, a.dtype, a.op);
      } else {
        kernels::reduce(sum, c0, contribution(1), n, a.dtype, a.op);
        for (int r = 2; r < p - 1; ++r) kernels::reduce(sum, sum, contribution(r), n, a.dtype, a.op);
        kernels::reduce(last, sum, contribution(p - 1), n, a.dtype, a.op);
      }
      if (a.op == ReduceOp::kAvg) kernels::divide(last, n, a.dtype, p);
      if (streaming) copy_streaming(target, sum, n * es);
      if (write_peers) {
        for (int k = 1; k < p; ++k) {
          const int r = (me + k) % p;
          write(r, remote_out(r) + b * es, last, n * es);
        }
      }
    }
  }
};

}  // namespace

void allreduce_shm(Communicator& comm, const AllreduceArgs& a) {
  SharedArena* arena = comm.shared_arena();
  ZCOLL_REQUIRE(
      arena != nullptr,
      "algorithm 'shm' needs every rank on one node and ZCOLL_SHM unset or 1; use 'ring' or 'auto'");
  const int p = comm.size();
  const std::size_t es = dtype_size(a.dtype);
  const Layout layout(arena->region_bytes, es, p);
  ZCOLL_CHECK_LE(std::size_t{16}, layout.block_elems, "shared arena too small (ZCOLL_SHM_BYTES)");
  ShmCall call{*arena,
               layout,
               static_cast<const unsigned char*>(a.in),
               static_cast<unsigned char*>(a.out),
               a.dtype,
               a.op,
               p,
               comm.rank(),
               es,
               comm.stats().bytes_sent};
  comm.recorder().mark_in_progress();
  if (arena->peer_memory != nullptr && a.count * es >= arena->single_copy_bytes) {
    const std::uint64_t s = ++arena->sequence;
    if (s > 2) arena->wait_all(kReduced, s - 2);  // as below: no iteration runs ahead of s - 2
    SingleCopyCall single{*arena, *arena->peer_memory, a, p, comm.rank(), es, comm.stats()};
    const std::size_t half = (a.count - a.count / 2) * es;  // the larger of the two halves
    const bool window_in = p == 2 && arena->peer_writes && a.count * es < arena->window_in_bytes &&
                           half <= layout.staging_bytes;
    if (window_in) {
      const int pair = static_cast<int>(s % 2);
      single.run_window_in(s, layout.staging(*arena, comm.rank(), pair),
                           layout.staging(*arena, 1 - comm.rank(), pair));
    } else {
      single.run(s);
    }
    return;
  }
  for (std::size_t begin = 0; begin < a.count; begin += layout.block_elems) {
    const detail::Range block{begin, std::min(layout.block_elems, a.count - begin)};
    const std::uint64_t s = ++arena->sequence;
    const int pair = static_cast<int>(s % 2);
    if (s > 2) arena->wait_all(kReduced, s - 2);
    if (block.count * es <= kDirectBytes)
      call.direct(block, s, pair);
    else
      call.staged(block, s, pair);
  }
}

double allreduce_shm_cost(const CostQuery& q) {
  const double p = q.ranks, S = q.bytes;
  return 3 * q.alpha + 2 * S * q.beta + (p - 1) / p * S * q.gamma;
}

}  // namespace zcoll
