// A transport for N ranks that are threads of one process (Gloo's test/base_test.h idea), and
// the communicator over it: the second implementation of comm/transport.h, for in-process C++
// tests of every algorithm and to keep that interface honest (nothing in it may assume MPI).
//
// Matching. Each rank owns a mailbox (mutex + condition variable) holding, in FIFO queues per
// (source, tag), the sends addressed to it that no receive has taken yet and its receives that
// no send has reached yet. A send and a receive match when they have the same (source,
// destination, tag) and are the oldest unmatched ones of their queues, so messages between one
// pair with one tag arrive in the order they were sent (MPI's non-overtaking rule). Sizes must
// be equal: the interface has no status to report a shorter message, so a difference is a bug
// in the caller, and both requests fail (at wait/test) with zcoll::Error naming both sizes.
//
// Completion is rendezvous: a send and its receive complete together, when the second of the
// two is posted, which copies the bytes straight from the send buffer into the receive buffer
// (under the receiver's mailbox lock). So a send never completes before its receive is posted.
// This is stricter than MPI's eager small messages on purpose: an algorithm that reuses a send
// buffer before wait(), or that needs a send to finish before the matching receive is posted,
// fails (wrong data, or a stall the watchdog reports) at every size instead of only beyond the
// MPI library's eager limit. Like MPI, no call of the receiver is needed once its receive is
// posted: irecv; isend; wait(send); wait(recv) on every rank of a ring completes.
//
// wait() blocks on the mailbox's condition variable (no spinning, so oversubscription costs
// nothing here), waking every Watchdog::check_interval_ns() to run the watchdog's checks
// (deadline, lost ranks, announcements: comm/watchdog.h); test() only looks. A communicator is
// used by one thread at a time, like an MPI rank.
//
// Failure detection for the watchdog: announcements go into per-rank queues of the group;
// InProcGroup::mark_lost(r) makes rank r's peers see it as a dead process (a test's way to
// "kill" a rank: its thread stops calling zcoll, as a killed process would). Each
// communicator's deadline is InProcOptions::timeout_seconds (not ZCOLL_TIMEOUT).
//
// Failure and abort. InProcGroup::abort(reason) marks the group aborted and wakes every waiter:
// waits and tests (blocked or later), posts, shared_arena()'s allocation and the shared arena's
// flag waits (through the watchdog's PeerMonitor::check) then throw GroupAborted. run_ranks
// aborts the group as soon as a rank throws, and also when no message has moved for
// InProcOptions::stall_seconds (a deadlock), naming what every rank waits for; so a failing or
// deadlocked algorithm never hangs the test program. Caveat, as with MPI, which keeps
// progressing a process's pending requests: a rank that throws with requests still posted
// leaves them posted until the group is aborted, right after that rank's stack has unwound; a
// peer matching one of them in that window copies from or into the unwound buffer, in a group
// that is about to abort anyway.
//
// Shared arena: one region per rank in plain process memory (64-byte aligned,
// InProcOptions::shared_arena_bytes of data after the flags), allocated collectively on the
// first shared_arena() call like MPI_Win_allocate_shared: every rank allocates its own region,
// publishes it and waits until all ranks have; it offers reads of the other ranks' memory (a
// memcpy: one address space) unless InProcOptions::peer_memory is false. oversubscribed():
// more ranks than the CPUs this process may run on (the arena's flag waits then yield early,
// comm/backoff.h). No native allreduce: algorithm "mpi" throws std::invalid_argument
// (Communicator::native_allreduce).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "common/error.h"

namespace zcoll {

// Thrown by waits on a rank of an aborted group (the reason is the message).
class GroupAborted : public Error {
 public:
  using Error::Error;
};

// Explicit settings, not the environment: a test says what it exercises (ZCOLL_SHM, which
// switches MPI's shared-memory path off, is not read here).
struct InProcOptions {
  bool shared_arena = true;            // offer the shm path (has_shared_arena)
  std::size_t shared_arena_bytes = 0;  // data bytes per rank; 0: ZCOLL_SHM_BYTES
  int cpus = 0;                        // CPUs for oversubscribed(); 0: this process's affinity mask
  double stall_seconds = 60.0;         // run_ranks: abort when no request moved for this long
  std::vector<int> nodes;              // a node label per rank (node_of); empty: one node. The
                                       // shm path needs one node, as over MPI.
  std::vector<double> bandwidth;       // p x p link bandwidths (bytes/s, row sends to column) for
                                       // Communicator::topology(); empty: none (ZCOLL_TOPOLOGY is
                                       // not read here)
  double timeout_seconds = 0.0;        // each communicator's deadline (<= 0: none)
  bool peer_memory = true;             // offer reads of other ranks' memory (the shm single copy)
  bool peer_writes = true;             // with peer_memory, offer writes too (else the single copy gathers by reads)
  std::size_t single_copy_bytes = 256 * 1024;  // shm calls from this size read peers directly
  std::size_t window_in_bytes = 1024 * 1024;  // 2 ranks, below this: the peer's input via the window
};

class InProcGroup;
namespace detail {
struct InProcOp;
struct InProcMailbox;
}  // namespace detail

// The transport of one rank: the group's mailboxes, its shared regions and its failure state.
class InProcTransport final : public Transport, public PeerMonitor, public SharedMemory, public PeerMemory {
 public:
  InProcTransport(InProcGroup& group, int rank);
  ~InProcTransport() override;

  int rank() const override { return rank_; }
  int size() const override;
  Request isend(const void* buf, std::size_t bytes, int peer, int tag) override;
  Request irecv(void* buf, std::size_t bytes, int peer, int tag) override;
  void wait(Request& request) override;
  bool test(Request& request) override;
  void cancel(Request& request) noexcept override;
  PeerMonitor& monitor() override { return *this; }
  // InProcOptions::shared_arena; the engine asks only when every rank is on one node.
  SharedMemory* shared_memory() override;

  // PeerMonitor
  bool peer_alive(int peer) override;
  std::string describe_peer(int peer) override;
  void announce(const PeerStatus& status) override;
  bool next_announcement(PeerStatus& status) override;
  void check() override;
  // SharedMemory
  SharedArena* arena() override;
  // PeerMemory: the ranks are threads of one process, so a plain copy
  void read(int rank, const void* remote, void* local, std::size_t bytes) override;
  void write(int rank, void* remote, const void* local, std::size_t bytes) override;

  bool oversubscribed() const;
  InProcGroup& group() { return group_; }
  std::string waiting_for() const;

 private:
  using Op = detail::InProcOp;
  Request post(bool is_send, void* buf, std::size_t bytes, int peer, int tag);
  Op& find(const Request& request);
  void finish(Request& request);
  void set_waiting(const Op* op, bool in_arena);

  InProcGroup& group_;
  const int rank_;
  std::uint64_t next_handle_ = 1;
  std::unordered_map<std::uint64_t, std::unique_ptr<Op>> ops_;  // posted, not yet completed
  SharedArena arena_;
  bool arena_ready_ = false;
  mutable std::mutex waiting_mu_;  // guards the two below (read by run_ranks' watchdog)
  const Op* waiting_ = nullptr;
  bool waiting_in_arena_ = false;
};

// The engine over rank `rank`'s InProcTransport, with the group's placement (nodes, topology,
// CPUs) and timeout.
class InProcCommunicator final : public Communicator {
 public:
  InProcCommunicator(InProcGroup& group, int rank);

  InProcGroup& group() { return inproc_.group(); }
  // What this rank is blocked on, for the stall report ("" when not blocked).
  std::string waiting_for() const { return inproc_.waiting_for(); }

 private:
  InProcTransport& inproc_;
};

class InProcGroup {
 public:
  explicit InProcGroup(int size, const InProcOptions& options = {});
  ~InProcGroup();
  InProcGroup(const InProcGroup&) = delete;
  InProcGroup& operator=(const InProcGroup&) = delete;

  int size() const { return size_; }
  int id() const { return id_; }  // numbers the groups of the process
  InProcCommunicator& comm(int rank) { return *comms_.at(static_cast<std::size_t>(rank)); }
  const InProcOptions& options() const { return options_; }

  // Wakes every waiter; every wait from now on throws GroupAborted(reason). The first reason
  // sticks.
  void abort(const std::string& reason);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Requests posted or completed so far (the watchdog's measure of progress).
  std::uint64_t progress() const { return progress_.load(std::memory_order_relaxed); }
  int cpus() const { return cpus_; }
  // Rank r's process is gone, as far as its peers' watchdogs can tell (their peer_alive(r) is
  // false from now on). The rank's thread should stop calling zcoll.
  void mark_lost(int rank);
  bool lost(int rank) const;

 private:
  friend class InProcTransport;
  friend class InProcCommunicator;  // reads topology_
  detail::InProcMailbox& mailbox(int rank) { return *mailboxes_.at(static_cast<std::size_t>(rank)); }
  [[noreturn]] void throw_aborted() const;

  InProcOptions options_;
  int size_ = 0;
  int id_ = 0;
  int cpus_ = 1;
  std::vector<std::unique_ptr<detail::InProcMailbox>> mailboxes_;
  Topology topology_;  // from options.bandwidth, once for every rank
  std::vector<std::unique_ptr<InProcCommunicator>> comms_;
  std::atomic<bool> aborted_{false};
  std::atomic<std::uint64_t> progress_{0};
  mutable std::mutex mu_;  // guards abort_reason_ and the arena table
  std::condition_variable arena_cv_;
  std::string abort_reason_;
  std::vector<unsigned char*> arena_regions_;  // owned; freed by the destructor
  int arena_published_ = 0;
  std::vector<bool> lost_;                           // guarded by mu_
  std::vector<std::deque<PeerStatus>> announcements_;  // per receiving rank, guarded by mu_
};

// A rank's exception, as run_ranks rethrows it: "rank R of N: <what>", with the original.
class RankFailure : public Error {
 public:
  RankFailure(int rank, std::exception_ptr original, const std::string& what)
      : Error(what), rank_(rank), original_(std::move(original)) {}
  int rank() const { return rank_; }  // -1: the watchdog (no rank threw; a stall)
  const std::exception_ptr& original() const { return original_; }

 private:
  int rank_;
  std::exception_ptr original_;
};

// Runs fn(comm) for every rank of a new group of `ranks` threads and returns when all are done.
// The first exception a rank throws aborts the group (the others' waits throw GroupAborted)
// and is rethrown here as RankFailure; a stall of options.stall_seconds aborts the group too
// and throws RankFailure(rank -1) describing every rank's wait. Never returns before every
// thread has finished: it may only be left waiting by a rank that computes forever without
// communicating.
void run_ranks(int ranks, const std::function<void(Communicator&)>& fn, const InProcOptions& options = {});

}  // namespace zcoll
