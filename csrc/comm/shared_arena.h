// Node-local shared memory that a transport can offer its algorithms: one region per rank,
// every region mapped into every rank's address space, plus the flag protocol the algorithms
// synchronise with. Allocated once per communicator (collectively), reused by every call.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/backoff.h"
#include "comm/watchdog.h"

namespace zcoll {

// The first bytes of every rank's region: monotonically increasing stage counters, one per
// cache line so that ranks polling one flag do not steal the line another rank writes.
struct alignas(64) SharedFlag {
  std::atomic<std::uint64_t> value{0};
  char pad[64 - sizeof(std::atomic<std::uint64_t>)];
};
inline constexpr int kSharedFlags = 5;
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "flags must be lock-free to live in shared memory");

// Reads another rank's private memory on the same node (cross-memory attach), so that an
// algorithm can copy a peer's buffer once instead of through the shared regions. Offered only
// where every rank of the node may read every other's (the transport checks this once, all
// ranks agreeing, when it makes the arena).
class PeerMemory {
 public:
  virtual ~PeerMemory() = default;
  // Copies `bytes` from `remote`, an address in rank `rank`'s address space, to `local`.
  // Throws when the read fails (RankLostError through the watchdog when the peer is gone).
  virtual void read(int rank, const void* remote, void* local, std::size_t bytes) = 0;
  // Copies `bytes` from `local` to `remote`, an address in rank `rank`'s address space. Called
  // only where SharedArena::peer_writes says the kernel allows it; throws like read().
  virtual void write(int rank, void* remote, const void* local, std::size_t bytes) = 0;
};

struct SharedArena {
  std::vector<unsigned char*> regions;  // regions[r]: rank r's region, as mapped in this process
  std::size_t region_bytes = 0;         // usable bytes after the flags
  bool yield_when_waiting = false;      // oversubscribed: give the core away while waiting
  std::uint64_t sequence = 0;           // stages completed by this communicator's algorithms;
                                        // advances identically on every rank
  // The communicator's watchdog (comm/watchdog.h), polled between unsuccessful polls of a flag:
  // it throws when the call's deadline passes, a rank is lost, or the transport aborted.
  Watchdog* watchdog = nullptr;
  // Cross-memory reads between the node's ranks, or null where the kernel refuses them; set
  // alike on every rank. Calls of at least single_copy_bytes use them.
  PeerMemory* peer_memory = nullptr;
  // Whether peer_memory may also write into other ranks' memory (process_vm_writev can be refused
  // where reads are allowed); set alike on every rank.
  bool peer_writes = false;
  // From 256 KiB one copy beats the window, 2 ranks, interleaved A/B: median 0.55 of the time
  // on a buffer pair used over and over (0.38-0.57 in 6 of 10 runs, to 1.03), 0.83-0.98 where
  // each input was just written by its owner; 1.15-1.29 where every call found its buffers out
  // of the core's caches, the trade 1 MiB already made (1.18 there). At 128 KiB one copy lost
  // on just-written inputs too (1.03-1.05).
  std::size_t single_copy_bytes = 256 * 1024;
  // 2 ranks, single-copy calls below this size: the half of `in` the peer reduces goes through
  // the shared window (copied by its owner) instead of process_vm_readv; results are still
  // written into the peer's `out`. Interleaved A/B against the plain single copy, 2 ranks, four
  // runs at load 1.7-4.3 (time / plain): on inputs just written by their owner 0.80-0.86 at 256 KiB,
  // 0.85-0.91 at 512 KiB; with buffers out of the caches 0.90-0.95 and 0.95-0.97; on one buffer
  // pair reused 1.18-1.29 and 1.15-1.21, the trade taken for the first two. At 1 MiB the gains
  // shrink (0.91-0.97 just written, 0.89-0.98 evicted) against 1.04-1.19 reused; at 2 MiB none.
  std::size_t window_in_bytes = 1024 * 1024;

  SharedFlag* flags(int rank) const { return reinterpret_cast<SharedFlag*>(regions[rank]); }
  unsigned char* data(int rank) const { return regions[rank] + kSharedFlags * sizeof(SharedFlag); }

  // A flag slot used as a word of data (an address), read after the flag that publishes it.
  void post(int rank, int slot, std::uint64_t value) const {
    flags(rank)[slot].value.store(value, std::memory_order_relaxed);
  }
  std::uint64_t posted(int rank, int slot) const {
    return flags(rank)[slot].value.load(std::memory_order_relaxed);
  }
  void publish(int rank, int flag, std::uint64_t value) const {
    flags(rank)[flag].value.store(value, std::memory_order_release);
  }
  // Waits until rank's `flag` has reached `value`.
  void wait(int rank, int flag, std::uint64_t value) const {
    std::atomic<std::uint64_t>& f = flags(rank)[flag].value;
    Backoff backoff(yield_when_waiting);
    while (f.load(std::memory_order_acquire) < value) {
      backoff.pause();
      watchdog->poll(rank);
    }
  }
  // Waits until every rank's `flag` has reached `value`.
  void wait_all(int flag, std::uint64_t value) const {
    for (std::size_t r = 0; r < regions.size(); ++r) wait(static_cast<int>(r), flag, value);
  }
};

}  // namespace zcoll
