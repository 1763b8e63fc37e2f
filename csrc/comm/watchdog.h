// Deadlines, dead-rank detection and abort for every wait of one communicator.
//
// Every place a rank can wait for another (the transports' wait(), the shared arena's flag
// spins, MPI's own allreduce) calls poll() between unsuccessful polls. poll() only counts; every
// kPollsPerCheck-th call, and on every wake-up of a blocking wait, check() runs:
//
//   1. the deadline: start of the collective + timeout (ZCOLL_TIMEOUT, Communicator(timeout=)).
//      "Start" is the first check of the call, so a call that never waits reads no clock;
//   2. an abort asked for from another thread (torch's Work.wait(timeout));
//   3. every kSlowCheckNs (100 ms): the peers' liveness (the transport's PeerMonitor,
//      comm/transport.h: on one machine, MPI ranks check each other's pid) and the peers'
//      failure announcements;
//   4. the transport's own state (PeerMonitor::check: the in-process group's abort).
//
// When one of these fails, the rank runs the failure protocol (fail()):
//   a. it announces its status (call, sequence number, reason) to every other rank through the
//      transport's out-of-band channel (a duplicated MPI communicator), without blocking;
//   b. it collects the other ranks' announcements for up to kGraceNs (1 s), or until every rank
//      was heard from or is known to be dead. A rank waiting anywhere in zcoll sees the first
//      announcement at its next slow check and fails the same way, so every surviving rank
//      announces within ~100 ms of the first failure;
//   c. the ranks not heard from "never arrived": stopped, dead, or outside zcoll;
//   d. it marks the communicator broken (every later call throws BrokenError at once), prints
//      one ZCOLL-FAILURE line on stderr (for launchers), and throws TimeoutError (RankLostError
//      when a peer is known to be dead) naming the call, its sequence number, its size, the
//      ranks that never arrived and what the others were doing.
//
// Cost when nothing fails: a counter per unsuccessful poll, a clock read every 64 of them; no
// clock read and no message for a call that does not wait. Off (set_enabled(false), for the
// benchmark's on/off comparison) a poll is one branch.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"

namespace zcoll {

class Communicator;

// A process on this machine as /proc shows it (kUnknown: on another machine, or no pid known).
enum class ProcessState { kUnknown, kRunning, kStopped, kGone };
// kill(pid, 0) says whether the pid exists; /proc says whether it is a zombie (killed, not yet
// reaped by its launcher) or stopped (state T or t).
ProcessState process_state(std::int64_t pid);

// The exit guard. A process that exits with a communicator a failure broke may wait forever in
// MPI_Finalize for a rank that is gone or stopped; one whose peers are merely slower (a loaded
// machine) must not be killed for it. Every MPI communicator notes its peers here when it is
// made (their pids on this machine, -1 for a peer on another machine), since MPI_Finalize may
// wait for any of them, freed communicators' included.
void note_exit_peer(std::int64_t pid);
// Starts a thread that ends the process with `status` (_exit, without MPI_Finalize) when, after
// `seconds`, a noted peer on this machine has been gone or stopped for kExitSettleNs, or some
// noted peer is on another machine (its pid cannot be checked: the timer alone decides), or no
// peer was noted; and in any case after `cap_seconds`. While every noted peer runs, it waits.
void exit_if_stuck(double seconds, int status, double cap_seconds);
// A peer seen gone or stopped must stay so this long: a peer that finalized and exited a moment
// ago lets this process's MPI_Finalize return within it.
constexpr std::int64_t kExitSettleNs = 1'000'000'000;

// What this communicator's last failure told its caller (the TimeoutError's attributes), plus
// the ranks that never arrived whose process this rank saw on this machine, stopped or running:
// not failed, so MPI will never hold them failed (zcoll.torch.elastic excludes them instead).
struct LastFailure {
  FailureInfo info;
  std::vector<int> alive;
};

// Why a rank's call failed (PeerStatus::reason).
enum class FailureReason : std::int64_t {
  kNone = 0,
  kTimeout,     // its deadline passed
  kRankLost,    // it found a peer's process gone (PeerStatus::lost)
  kPeerFailed,  // another rank announced a failure
  kAborted,     // the caller aborted it (Communicator::watchdog().request_abort)
  kTransport,   // the transport reported an error on a message
  kLeft,        // (announced by the leaving rank itself, Watchdog::leave) it will make no more calls:
                // its process is exiting with an uncaught exception
};

// What a failing rank announces to every other (sent as raw bytes: a flat, fixed layout).
struct PeerStatus {
  static constexpr std::int64_t kMagic = 0x7a636f6c6c535453;  // "zcollSTS"
  std::int64_t magic = kMagic;
  std::int64_t rank = -1;
  std::int64_t seq = 0;      // the call it is in, or the last one it finished
  std::int64_t in_call = 0;  // 1: inside call `seq`
  std::int64_t bytes = 0;
  std::int64_t reason = 0;   // FailureReason
  std::int64_t lost = -1;    // kRankLost: the rank found gone
  char collective[24] = {};  // the call's name, NUL-terminated
  char detail[64] = {};      // kLeft: why it leaves, NUL-terminated
};

class Watchdog {
 public:
  static constexpr int kPollsPerCheck = 64;
  static constexpr std::int64_t kSlowCheckNs = 100'000'000;
  static constexpr std::int64_t kGraceNs = 1'000'000'000;

  explicit Watchdog(Communicator& comm);
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Seconds from the start of a collective until it fails; <= 0: no deadline (liveness and
  // announcements are still checked). Default: ZCOLL_TIMEOUT.
  void set_timeout(double seconds);
  double timeout() const {
    const std::int64_t t = timeout_ns_.load(std::memory_order_relaxed);
    return t == kNever ? 0.0 : static_cast<double>(t) / 1e9;
  }
  // Off: waits poll exactly as without a watchdog (no deadline, no liveness, no announcements).
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }

  // A collective begins / ends (collectives/call_scope.h). Nested calls (a collective that runs
  // another) count once. begin_call throws BrokenError on a broken communicator. `name` must be
  // a string literal (kept by pointer).
  std::uint64_t begin_call(const char* name, std::size_t bytes);
  void end_call();
  std::uint64_t seq() const { return seq_; }
  bool in_call() const { return depth_ > 0; }
  const char* call_name() const { return name_; }
  std::size_t call_bytes() const { return bytes_; }

  // Between unsuccessful polls of a wait, on the waiting thread; `peer`: the rank waited for
  // (-1: several). Throws TimeoutError / RankLostError when the call fails.
  void poll(int peer = -1) {
    if (!enabled_ || (++polls_ & (kPollsPerCheck - 1)) != 0) return;
    check(peer);
  }
  // The full check (blocking waits call it on every wake-up).
  void check(int peer = -1);
  // How long a blocking wait may sleep before it must call check() again.
  std::int64_t check_interval_ns() const { return enabled_ ? kSlowCheckNs / 4 : kNever; }

  // From any thread: the running (or next) wait of this communicator fails with
  // FailureReason::kAborted and this reason.
  void request_abort(const std::string& reason);
  // The transport reported an error on a message with `peer`: fail the call naming it.
  [[noreturn]] void fail_transport(int peer, const std::string& what, bool peer_lost);
  // This rank will make no more calls on this communicator (its process is exiting with an
  // uncaught exception, `why`): it announces so (FailureReason::kLeft), and the others' waits
  // fail at their next slow check with RankLostError naming it as lost and never arrived,
  // instead of at their deadline. Afterwards the communicator is broken here too (later calls
  // raise BrokenError; free() releases nothing through MPI) without counting as a failure of
  // this process (broken_count). Does not block; nothing on a broken communicator.
  void leave(const std::string& why);
  // This communicator has been replaced (shrunk to its survivors, comm/fault_tolerance.h): broken
  // from now on (later calls raise BrokenError naming `why`; free() releases nothing through
  // MPI), without an announcement and without counting as a failure of this process.
  void retire(const std::string& why);

  bool broken() const { return broken_.load(std::memory_order_acquire); }
  // Communicators of this process broken so far (the Python layer then ends the process with
  // MPI_Abort instead of MPI_Finalize, which would wait for the lost ranks).
  static int broken_count();
  std::string broken_reason() const;
  void throw_if_broken() const;
  // The failure that broke this communicator (none after leave() or retire(), or before a failure).
  std::optional<LastFailure> last_failure() const;

  // Called with the failure's text just before it is thrown; returns the path of a dump of
  // this rank's state ("" for none). Set by the flight recorder.
  std::function<std::string(const std::string& what)> on_failure;

 private:
  static constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

  // What a failing rank learnt from the others (fail(), step b).
  struct Heard {
    std::vector<bool> heard, dead, left;  // left: announced kLeft (then dead, and not heard)
    std::vector<PeerStatus> status;
  };
  void slow_check();
  Heard collect(const PeerStatus& mine, int lost, const PeerStatus* trigger);
  // alive: the never-arrived ranks whose process describe_peer saw, stopped or running.
  std::string describe(FailureReason reason, int peer, const std::string& cause, const PeerStatus& mine,
                       const Heard& heard, std::vector<int>& alive) const;
  // peer: the rank found lost (kRankLost) or named by the transport (kTransport); trigger: the
  // announcement that made this rank fail (kPeerFailed).
  [[noreturn]] void fail(FailureReason reason, int peer, const std::string& cause, const PeerStatus* trigger);
  PeerStatus my_status(FailureReason reason, int lost) const;

  Communicator& comm_;
  bool enabled_ = true;
  std::atomic<std::int64_t> timeout_ns_{kNever};  // read by dumps on other threads
  unsigned polls_ = 0;
  // The current call.
  int depth_ = 0;
  std::uint64_t seq_ = 0;
  const char* name_ = "";
  std::size_t bytes_ = 0;
  std::int64_t started_ns_ = 0;  // at the call's first check (0: not yet)
  std::int64_t deadline_ns_ = kNever;
  std::int64_t next_slow_ns_ = 0;
  // Failure state, read from other threads.
  std::atomic<bool> abort_requested_{false};
  std::atomic<bool> broken_{false};
  mutable std::mutex mu_;  // guards the two strings and last_failure_
  std::string abort_reason_;
  std::string broken_reason_;
  std::optional<LastFailure> last_failure_;
};

}  // namespace zcoll
