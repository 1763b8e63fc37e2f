#include "comm/inproc_communicator.h"

#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <new>
#include <thread>

#include "common/check.h"
#include "common/env.h"

namespace zcoll {
namespace detail {

// One posted send or receive. Fields above the line never change after posting; the rest are
// guarded by the mutex of the mailbox of `dst` (the receiving rank).
struct InProcOp {
  bool is_send = false;
  int src = 0, dst = 0, tag = 0;
  void* buf = nullptr;  // a send's buffer is only read
  std::size_t bytes = 0;
  // ---
  bool done = false;
  std::string error;  // set with done when the match failed
};

struct InProcMailbox {
  std::mutex mu;
  std::condition_variable cv;
  // Unmatched operations addressed to this rank, FIFO per (source, tag).
  std::map<std::pair<int, int>, std::deque<InProcOp*>> sends, recvs;
};

}  // namespace detail

namespace {

using detail::concat;
using detail::InProcMailbox;
using detail::InProcOp;

int process_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  const unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

// Completes a send and the receive it meets, under the receiver's mailbox lock: copies the
// bytes (on whichever thread posted second) or, when the sizes differ, fails both.
void match(InProcOp& send, InProcOp& recv) {
  if (send.bytes != recv.bytes) {
    const std::string e =
        concat("in-process transport: rank ", send.src, " sent ", send.bytes, " bytes to rank ", send.dst,
               " with tag ", send.tag, " but the matching receive expects ", recv.bytes,
               " bytes (sizes must be equal)");
    send.error = recv.error = e;
  } else if (send.bytes) {
    std::memcpy(recv.buf, send.buf, send.bytes);
  }
  send.done = recv.done = true;
}

std::string describe(const InProcOp& op) {
  return op.is_send
             ? concat("waits for rank ", op.dst, " to receive its send (tag ", op.tag, ", ", op.bytes,
                      " bytes)")
             : concat("waits for a message from rank ", op.src, " (tag ", op.tag, ", ", op.bytes, " bytes)");
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

}  // namespace

// ---- InProcTransport -----------------------------------------------------------------------

InProcTransport::InProcTransport(InProcGroup& group, int rank) : group_(group), rank_(rank) {}
InProcTransport::~InProcTransport() = default;

int InProcTransport::size() const { return group_.size(); }

bool InProcTransport::oversubscribed() const { return group_.size() > group_.cpus(); }

SharedMemory* InProcTransport::shared_memory() { return group_.options().shared_arena ? this : nullptr; }

Request InProcTransport::post(bool is_send, void* buf, std::size_t bytes, int peer, int tag) {
  ZCOLL_REQUIRE(peer >= 0 && peer < size(), "peer ", peer, " out of range for ", size(), " ranks");
  ZCOLL_REQUIRE(bytes == 0 || buf != nullptr, "null buffer for ", bytes, " bytes");
  // Owned by this rank until completed; entered before it is queued (nothing can fail after).
  const std::uint64_t handle = next_handle_++;
  Op& op = *ops_.emplace(handle, std::make_unique<Op>()).first->second;
  op.is_send = is_send;
  op.src = is_send ? rank_ : peer;
  op.dst = is_send ? peer : rank_;
  op.tag = tag;
  op.buf = buf;
  op.bytes = bytes;
  Request request;
  request.handle = handle;
  request.peer = peer;
  request.active = true;
  InProcMailbox& box = group_.mailbox(op.dst);
  {
    std::lock_guard<std::mutex> lock(box.mu);
    if (group_.aborted()) {
      ops_.erase(handle);
      group_.throw_aborted();
    }
    const std::pair<int, int> key{op.src, tag};
    auto& waiting = is_send ? box.recvs[key] : box.sends[key];
    if (waiting.empty()) {
      (is_send ? box.sends[key] : box.recvs[key]).push_back(&op);
    } else {
      Op& other = *waiting.front();
      waiting.pop_front();
      match(is_send ? op : other, is_send ? other : op);
      box.cv.notify_all();  // the other side may be waiting
    }
  }
  group_.progress_.fetch_add(1, std::memory_order_relaxed);
  return request;
}

Request InProcTransport::isend(const void* buf, std::size_t bytes, int peer, int tag) {
  return post(true, const_cast<void*>(buf), bytes, peer, tag);
}

Request InProcTransport::irecv(void* buf, std::size_t bytes, int peer, int tag) {
  return post(false, buf, bytes, peer, tag);
}

InProcTransport::Op& InProcTransport::find(const Request& request) {
  auto it = ops_.find(request.handle);
  ZCOLL_CHECK_EQ(it != ops_.end(), true, "in-process transport: request ", request.handle,
                 " is not an active request of rank ", rank_);
  return *it->second;
}

void InProcTransport::finish(Request& request) {
  auto it = ops_.find(request.handle);
  const std::string error = it->second->error;
  ops_.erase(it);
  request.active = false;
  group_.progress_.fetch_add(1, std::memory_order_relaxed);
  if (!error.empty()) throw Error(error);
}

void InProcTransport::set_waiting(const Op* op, bool in_arena) {
  std::lock_guard<std::mutex> lock(waiting_mu_);
  waiting_ = op;
  waiting_in_arena_ = in_arena;
}

void InProcTransport::wait(Request& request) {
  if (!request.active) return;
  Op& op = find(request);
  InProcMailbox& box = group_.mailbox(op.dst);
  set_waiting(&op, false);
  try {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(box.mu);
        auto ready = [&] { return op.done || group_.aborted(); };
        if (watchdog().enabled())
          box.cv.wait_for(lock, std::chrono::nanoseconds(watchdog().check_interval_ns()), ready);
        else
          box.cv.wait(lock, ready);
        if (op.done && !group_.aborted()) break;
      }
      check();
      watchdog().check(request.peer);  // the deadline, lost ranks, announcements
    }
  } catch (...) {
    set_waiting(nullptr, false);
    throw;
  }
  set_waiting(nullptr, false);
  finish(request);
}

bool InProcTransport::test(Request& request) {
  if (!request.active) return true;
  Op& op = find(request);
  InProcMailbox& box = group_.mailbox(op.dst);
  {
    std::lock_guard<std::mutex> lock(box.mu);
    if (group_.aborted()) group_.throw_aborted();
    if (!op.done) return false;
  }
  finish(request);
  return true;
}

// An unmatched operation leaves its queue (nothing will ever copy into or out of its buffer); a
// matched one is already complete. Either way this rank forgets it.
void InProcTransport::cancel(Request& request) noexcept {
  if (!request.active) return;
  request.active = false;
  auto it = ops_.find(request.handle);
  if (it == ops_.end()) return;
  Op& op = *it->second;
  InProcMailbox& box = group_.mailbox(op.dst);
  {
    std::lock_guard<std::mutex> lock(box.mu);
    if (!op.done) {
      auto& queues = op.is_send ? box.sends : box.recvs;
      auto q = queues.find({op.src, op.tag});
      if (q != queues.end()) {
        auto& waiting = q->second;
        for (auto w = waiting.begin(); w != waiting.end(); ++w)
          if (*w == &op) {
            waiting.erase(w);
            break;
          }
      }
    }
  }
  ops_.erase(it);
}

SharedArena* InProcTransport::arena() {
  if (arena_ready_) return &arena_;
  if (group_.aborted()) group_.throw_aborted();  // (a region published before stays the group's)
  const std::size_t data_bytes = group_.options().shared_arena_bytes
                                     ? group_.options().shared_arena_bytes
                                     : static_cast<std::size_t>(env::get_int(env::Var::kShmBytes));
  const std::size_t bytes = (kSharedFlags * sizeof(SharedFlag) + data_bytes + 63) / 64 * 64;
  auto* region = static_cast<unsigned char*>(std::aligned_alloc(64, bytes));
  if (!region) throw std::bad_alloc();
  // A fixed pattern instead of zeros, so that reading data nobody staged shows up in results.
  std::memset(region, 0xA5, bytes);
  for (int f = 0; f < kSharedFlags; ++f) new (region + f * sizeof(SharedFlag)) SharedFlag();
  {
    std::unique_lock<std::mutex> lock(group_.mu_);
    group_.arena_regions_[static_cast<std::size_t>(rank_)] = region;  // the group frees it
    ++group_.arena_published_;
    group_.arena_cv_.notify_all();
    set_waiting(nullptr, true);
    group_.arena_cv_.wait(lock, [&] { return group_.arena_published_ == size() || group_.aborted(); });
    set_waiting(nullptr, false);
    if (group_.aborted()) {
      lock.unlock();
      group_.throw_aborted();
    }
    arena_.regions = group_.arena_regions_;
  }
  group_.progress_.fetch_add(1, std::memory_order_relaxed);
  arena_.region_bytes = data_bytes;
  arena_.yield_when_waiting = oversubscribed();
  arena_.watchdog = &watchdog();
  arena_.peer_memory = group_.options().peer_memory ? this : nullptr;
  arena_.peer_writes = group_.options().peer_memory && group_.options().peer_writes;
  arena_.single_copy_bytes = group_.options().single_copy_bytes;
  arena_.window_in_bytes = group_.options().window_in_bytes;
  arena_ready_ = true;
  return &arena_;
}

void InProcTransport::read(int, const void* remote, void* local, std::size_t bytes) {
  std::memcpy(local, remote, bytes);
}

void InProcTransport::write(int, void* remote, const void* local, std::size_t bytes) {
  std::memcpy(remote, local, bytes);
}

bool InProcTransport::peer_alive(int peer) { return !group_.lost(peer); }

std::string InProcTransport::describe_peer(int peer) {
  return group_.lost(peer) ? "marked lost (InProcGroup::mark_lost)" : "";
}

void InProcTransport::announce(const PeerStatus& status) {
  std::lock_guard<std::mutex> lock(group_.mu_);
  for (int r = 0; r < size(); ++r)
    if (r != rank_) group_.announcements_[static_cast<std::size_t>(r)].push_back(status);
}

bool InProcTransport::next_announcement(PeerStatus& status) {
  std::lock_guard<std::mutex> lock(group_.mu_);
  auto& queue = group_.announcements_[static_cast<std::size_t>(rank_)];
  if (queue.empty()) return false;
  status = queue.front();
  queue.pop_front();
  return true;
}

void InProcTransport::check() {
  if (group_.aborted()) group_.throw_aborted();
}

std::string InProcTransport::waiting_for() const {
  std::lock_guard<std::mutex> lock(waiting_mu_);
  if (waiting_) return describe(*waiting_);
  if (waiting_in_arena_) return "waits in shared_arena() for every rank to allocate its region";
  return "";
}

// ---- InProcGroup ----------------------------------------------------------------------------

InProcGroup::InProcGroup(int size, const InProcOptions& options) : options_(options) {
  static std::atomic<int> groups{0};
  id_ = ++groups;
  ZCOLL_REQUIRE(size >= 1, "an in-process group needs at least one rank, not ", size);
  size_ = size;
  cpus_ = options.cpus > 0 ? options.cpus : process_cpus();
  arena_regions_.assign(static_cast<std::size_t>(size), nullptr);
  lost_.assign(static_cast<std::size_t>(size), false);
  announcements_.resize(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) mailboxes_.push_back(std::make_unique<InProcMailbox>());
  ZCOLL_REQUIRE(options.nodes.empty() || options.nodes.size() == static_cast<std::size_t>(size),
                "InProcOptions::nodes has ", options.nodes.size(), " labels for ", size, " ranks");
  if (!options.bandwidth.empty()) topology_ = topology_from_bandwidth(options.bandwidth, size);
  for (int r = 0; r < size; ++r) comms_.push_back(std::make_unique<InProcCommunicator>(*this, r));
}

// ---- InProcCommunicator ----------------------------------------------------------------------

InProcCommunicator::InProcCommunicator(InProcGroup& group, int rank)
    : Communicator(std::make_unique<InProcTransport>(group, rank)),
      inproc_(static_cast<InProcTransport&>(transport())) {
  watchdog().set_timeout(group.options().timeout_seconds);
  if (!group.options().nodes.empty()) set_nodes(group.options().nodes);
  if (!group.options().bandwidth.empty()) set_topology(group.topology_);
  set_oversubscribed(inproc_.oversubscribed());
  set_identity(concat("inproc-", group.id()));
}

InProcGroup::~InProcGroup() {
  comms_.clear();
  for (unsigned char* region : arena_regions_) std::free(region);
}

void InProcGroup::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_reason_.empty()) abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
    arena_cv_.notify_all();
  }
  // Taking each lock before notifying: a waiter checks the flag under its mailbox lock, so it
  // either sees the flag or is already waiting when the notification comes.
  for (auto& box : mailboxes_) {
    std::lock_guard<std::mutex> lock(box->mu);
    box->cv.notify_all();
  }
}

void InProcGroup::mark_lost(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  lost_.at(static_cast<std::size_t>(rank)) = true;
}

bool InProcGroup::lost(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_.at(static_cast<std::size_t>(rank));
}

void InProcGroup::throw_aborted() const {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reason = abort_reason_;
  }
  throw GroupAborted("in-process group aborted: " + reason);
}

// ---- run_ranks ------------------------------------------------------------------------------

void run_ranks(int ranks, const std::function<void(Communicator&)>& fn, const InProcOptions& options) {
  InProcGroup group(ranks, options);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> finished(static_cast<std::size_t>(ranks), false);
  int num_finished = 0;
  bool failed = false;
  std::exception_ptr first;  // null for a stall
  int first_rank = -1;
  std::string first_what;

  auto fail = [&](int rank, std::exception_ptr e, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (failed) return;  // a consequence of the first failure (GroupAborted), or a later one
      failed = true;
      first = std::move(e);
      first_rank = rank;
      first_what = what;
    }
    group.abort(what);
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(ranks));
  auto body = [&](int r) {
    try {
      fn(group.comm(r));
    } catch (...) {
      std::exception_ptr e = std::current_exception();
      fail(r, e, concat("rank ", r, " of ", ranks, ": ", what_of(e)));
    }
    std::lock_guard<std::mutex> lock(mu);
    finished[static_cast<std::size_t>(r)] = true;
    ++num_finished;
    cv.notify_all();
  };
  for (int r = 0; r < ranks; ++r) {
    try {
      threads.emplace_back(body, r);
    } catch (...) {  // no thread for rank r: release the ranks already started, then report
      group.abort(concat("could not start the thread of rank ", r));
      for (auto& t : threads) t.join();
      throw;
    }
  }

  // The calling thread is the watchdog: a group in which no request has been posted or
  // completed for stall_seconds is deadlocked (or lost in a shared-memory wait).
  using Clock = std::chrono::steady_clock;
  const auto stall = std::chrono::duration<double>(options.stall_seconds);
  std::uint64_t last_progress = group.progress();
  auto last_change = Clock::now();
  std::unique_lock<std::mutex> lock(mu);
  while (num_finished < ranks) {
    cv.wait_for(lock, std::chrono::milliseconds(100));
    const std::uint64_t now_progress = group.progress();
    if (now_progress != last_progress) {
      last_progress = now_progress;
      last_change = Clock::now();
    } else if (!group.aborted() && Clock::now() - last_change > stall) {
      std::string report =
          concat("no request posted or completed for ", options.stall_seconds, " s (deadlock?):");
      for (int r = 0; r < ranks; ++r) {
        std::string state = finished[static_cast<std::size_t>(r)] ? "finished" : group.comm(r).waiting_for();
        if (state.empty()) state = "running (not in a wait: computing, or spinning on shared memory)";
        report += concat("\n  rank ", r, ": ", state);
      }
      lock.unlock();
      fail(-1, nullptr, report);
      lock.lock();
    }
  }
  lock.unlock();
  for (auto& t : threads) t.join();
  if (!failed) return;
  throw RankFailure(first_rank, first, first_what);
}

}  // namespace zcoll
