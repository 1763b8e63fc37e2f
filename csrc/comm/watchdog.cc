#include "comm/watchdog.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/clock.h"
#include "comm/communicator.h"
#include "common/check.h"
#include "common/env.h"

namespace zcoll {
namespace {

using detail::concat;

void sleep_ns(std::int64_t ns) {
  timespec ts{static_cast<time_t>(ns / kNsPerSecond), static_cast<long>(ns % kNsPerSecond)};
  nanosleep(&ts, nullptr);
}

// "Rank 3", "Ranks 1, 2" (they start a sentence)
std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "Rank " : "Ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += concat(i ? ", " : "", ranks[i]);
  return s;
}

std::string list_text(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += concat(i ? "," : "", ranks[i]);
  return s.empty() ? "-" : s;
}

const char* kind_name(FailureReason r) {
  switch (r) {
    case FailureReason::kTimeout: return "timeout";
    case FailureReason::kRankLost: return "rank_lost";
    case FailureReason::kPeerFailed: return "peer_failed";
    case FailureReason::kAborted: return "aborted";
    case FailureReason::kTransport: return "transport";
    case FailureReason::kLeft: return "left";
    case FailureReason::kNone: break;
  }
  return "none";
}

// What a peer's announcement says it was doing: "in allreduce #12", "between calls (after #11)".
std::string doing(const PeerStatus& s) {
  if (s.in_call) return concat("in ", s.collective, " #", s.seq);
  return concat("in no zcoll call (its last was #", s.seq, ")");
}

// Why a peer says it failed, as "rank R <this>".
std::string peer_reason(const PeerStatus& s) {
  switch (static_cast<FailureReason>(s.reason)) {
    case FailureReason::kTimeout: return concat("timed out ", doing(s));
    case FailureReason::kRankLost: return concat("found rank ", s.lost, " lost ", doing(s));
    case FailureReason::kAborted: return concat("was aborted ", doing(s));
    case FailureReason::kTransport: return concat("had a transport error ", doing(s));
    case FailureReason::kLeft: return concat("left: ", s.detail);
    default: break;
  }
  return concat("failed ", doing(s));
}

std::atomic<int> g_broken_count{0};

// The exit guard's peers (note_exit_peer): pids on this machine; -1 stands for every peer on
// another machine.
std::mutex g_exit_mu;
std::set<std::int64_t>& exit_peers() {
  static auto* peers = new std::set<std::int64_t>;  // never destroyed: the guard thread outlives statics
  return *peers;
}

// The first noted peer that is gone or stopped ("" if none): what MPI_Finalize may wait for forever.
std::string stuck_on(const std::set<std::int64_t>& peers) {
  for (const std::int64_t pid : peers) {
    if (pid < 0) continue;
    const ProcessState st = process_state(pid);
    if (st == ProcessState::kGone) return concat("peer process ", pid, " is gone");
    if (st == ProcessState::kStopped) return concat("peer process ", pid, " is stopped");
  }
  return "";
}

[[noreturn]] void exit_now(const std::string& why, int status) {
  std::fprintf(stderr, "zcoll: this process, exiting with a broken communicator, %s: exiting with status %d\n",
               why.c_str(), status);
  std::fflush(stderr);
  _exit(status);
}

}  // namespace

ProcessState process_state(std::int64_t pid) {
  if (pid <= 0) return ProcessState::kUnknown;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return ProcessState::kGone;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return ProcessState::kRunning;
  const auto paren = line.rfind(')');
  const char state = paren != std::string::npos && paren + 2 < line.size() ? line[paren + 2] : 'R';
  if (state == 'Z' || state == 'X') return ProcessState::kGone;
  if (state == 'T' || state == 't') return ProcessState::kStopped;
  return ProcessState::kRunning;
}

void note_exit_peer(std::int64_t pid) {
  std::lock_guard<std::mutex> lock(g_exit_mu);
  exit_peers().insert(pid < 0 ? -1 : pid);
}

void exit_if_stuck(double seconds, int status, double cap_seconds) {
  std::set<std::int64_t> peers;
  {
    std::lock_guard<std::mutex> lock(g_exit_mu);
    peers = exit_peers();
  }
  const auto to_ns = [](double s) { return static_cast<std::int64_t>(s * 1e9); };
  std::thread([peers, status, after = to_ns(seconds), cap = to_ns(std::max(seconds, cap_seconds)), seconds,
               cap_seconds] {
    const std::int64_t start = coarse_ns();
    const bool timer_only = peers.empty() || peers.count(-1) > 0;  // a peer whose pid says nothing here
    std::int64_t stuck_since = 0;  // since when stuck_on() has named a peer (0: it names none)
    for (;;) {
      sleep_ns(100'000'000);
      const std::int64_t now = coarse_ns();
      const std::string why = timer_only ? "" : stuck_on(peers);
      stuck_since = why.empty() ? 0 : stuck_since ? stuck_since : now;
      if (now - start >= cap)
        exit_now(concat("did not end within ", cap_seconds, " s (its peers still run)"), status);
      if (now - start < after) continue;
      if (timer_only)
        exit_now(concat("did not end within ", seconds, " s (MPI_Finalize waiting for a lost rank? a peer on ",
                        "another machine cannot be checked)"),
                 status);
      if (stuck_since && now - stuck_since >= kExitSettleNs)
        exit_now(concat("did not end within ", seconds, " s and ", why, " (MPI_Finalize may wait for it forever)"),
                 status);
    }
  }).detach();
}

int Watchdog::broken_count() { return g_broken_count.load(std::memory_order_relaxed); }

Watchdog::Watchdog(Communicator& comm) : comm_(comm) {
  set_timeout(static_cast<double>(env::get_int(env::Var::kTimeout)));
}

void Watchdog::set_timeout(double seconds) {
  ZCOLL_REQUIRE(seconds == seconds, "timeout must be a number of seconds, not NaN");
  timeout_ns_.store(seconds > 0 && seconds < 1e9 ? static_cast<std::int64_t>(seconds * 1e9) : kNever,
                    std::memory_order_relaxed);
}

std::uint64_t Watchdog::begin_call(const char* name, std::size_t bytes) {
  throw_if_broken();
  if (depth_++ > 0) return seq_;
  ++seq_;
  name_ = name;
  bytes_ = bytes;
  started_ns_ = 0;
  deadline_ns_ = kNever;
  if (abort_requested_.load(std::memory_order_relaxed)) fail(FailureReason::kAborted, -1, "", nullptr);
  return seq_;
}

void Watchdog::end_call() {
  if (depth_ > 0) --depth_;
}

void Watchdog::check(int peer) {
  if (!enabled_) return;
  comm_.monitor().check();
  if (peer >= 0) comm_.recorder().waiting_for(peer);  // (the engine's Channel sets it for messages)
  const std::int64_t now = coarse_ns();
  if (started_ns_ == 0 && depth_ > 0) {
    started_ns_ = now;
    const std::int64_t timeout = timeout_ns_.load(std::memory_order_relaxed);
    deadline_ns_ = timeout == kNever ? kNever : now + timeout;
  }
  if (abort_requested_.load(std::memory_order_relaxed)) fail(FailureReason::kAborted, -1, "", nullptr);
  if (now >= deadline_ns_) fail(FailureReason::kTimeout, -1, "", nullptr);
  if (now >= next_slow_ns_) {
    next_slow_ns_ = now + kSlowCheckNs;
    slow_check();
  }
}

void Watchdog::slow_check() {
  PeerStatus s;
  if (comm_.monitor().next_announcement(s) && s.magic == PeerStatus::kMagic && s.rank >= 0 &&
      s.rank < comm_.size() && s.rank != comm_.rank()) {
    s.detail[sizeof s.detail - 1] = '\0';
    // a rank that left is lost to this communicator, as a dead process is
    if (static_cast<FailureReason>(s.reason) == FailureReason::kLeft)
      fail(FailureReason::kRankLost, static_cast<int>(s.rank), concat("it left: ", s.detail), &s);
    fail(FailureReason::kPeerFailed, -1, "", &s);
  }
  for (int r = 0; r < comm_.size(); ++r)
    if (r != comm_.rank() && !comm_.monitor().peer_alive(r)) fail(FailureReason::kRankLost, r, "", nullptr);
}

void Watchdog::request_abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_reason_.empty()) abort_reason_ = reason;
  }
  abort_requested_.store(true, std::memory_order_release);
}

void Watchdog::fail_transport(int peer, const std::string& what, bool peer_lost) {
  fail(peer_lost ? FailureReason::kRankLost : FailureReason::kTransport, peer, what, nullptr);
}

void Watchdog::leave(const std::string& why) {
  if (broken()) return;
  PeerStatus s = my_status(FailureReason::kLeft, comm_.rank());
  std::snprintf(s.detail, sizeof s.detail, "%s", why.c_str());
  try {
    comm_.monitor().announce(s);  // best effort, as in fail()
  } catch (const std::exception&) {
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken_reason_ = concat("zcoll: rank ", comm_.rank(), " left this communicator (", why, ").");
  }
  broken_.store(true, std::memory_order_release);
}

void Watchdog::retire(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken_reason_ = concat("zcoll: ", why, ".");
  }
  broken_.store(true, std::memory_order_release);
}

std::optional<LastFailure> Watchdog::last_failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_failure_;
}

std::string Watchdog::broken_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_reason_;
}

void Watchdog::throw_if_broken() const {
  if (!broken()) return;
  throw BrokenError(concat("this zcoll communicator is broken by an earlier failure: ", broken_reason(),
                           " Messages of that call may still be posted, so nothing can be matched safely on it "
                           "again: create a new communicator (free() on this one releases nothing through MPI)."));
}

PeerStatus Watchdog::my_status(FailureReason reason, int lost) const {
  PeerStatus s;
  s.rank = comm_.rank();
  s.seq = static_cast<std::int64_t>(seq_);
  s.in_call = depth_ > 0;
  s.bytes = static_cast<std::int64_t>(bytes_);
  s.reason = static_cast<std::int64_t>(reason);
  s.lost = lost;
  std::snprintf(s.collective, sizeof s.collective, "%s", depth_ > 0 ? name_ : "");
  return s;
}

// b. The others' announcements for up to kGraceNs, or until every rank was heard from or is
// known to be gone.
Watchdog::Heard Watchdog::collect(const PeerStatus& mine, int lost, const PeerStatus* trigger) {
  const int p = comm_.size();
  Heard h;
  h.heard.assign(static_cast<std::size_t>(p), false);
  h.dead.assign(static_cast<std::size_t>(p), false);
  h.left.assign(static_cast<std::size_t>(p), false);
  h.status.resize(static_cast<std::size_t>(p));
  h.heard[mine.rank] = true;
  h.status[mine.rank] = mine;
  auto take = [&](const PeerStatus& s) {
    if (s.magic != PeerStatus::kMagic || s.rank < 0 || s.rank >= p) return;
    h.heard[s.rank] = true;
    h.status[s.rank] = s;
    h.status[s.rank].collective[sizeof s.collective - 1] = '\0';
    h.status[s.rank].detail[sizeof s.detail - 1] = '\0';
    if (static_cast<FailureReason>(s.reason) == FailureReason::kRankLost && s.lost >= 0 && s.lost < p)
      h.dead[s.lost] = true;
    if (static_cast<FailureReason>(s.reason) == FailureReason::kLeft) {  // gone from this communicator
      h.heard[s.rank] = false;
      h.dead[s.rank] = h.left[s.rank] = true;
    }
  };
  if (trigger) take(*trigger);
  if (lost >= 0 && lost < p) h.dead[lost] = true;
  const std::int64_t end = coarse_ns() + kGraceNs;
  std::int64_t next_liveness = 0;
  try {
    for (;;) {
      PeerStatus s;
      while (comm_.monitor().next_announcement(s)) take(s);
      const std::int64_t now = coarse_ns();
      const bool liveness = now >= next_liveness;
      if (liveness) next_liveness = now + 50'000'000;
      bool waiting = false;
      for (int r = 0; r < p; ++r) {
        if (h.heard[r] || h.dead[r]) continue;
        if (liveness && !comm_.monitor().peer_alive(r)) h.dead[r] = true;
        else waiting = true;
      }
      if (!waiting || now >= end) break;
      sleep_ns(1'000'000);
    }
  } catch (const std::exception&) {  // the channel failed: report what was heard so far
  }
  return h;
}

// c. The message: the call, why it failed, who never arrived, what the others were doing.
std::string Watchdog::describe(FailureReason reason, int peer, const std::string& cause, const PeerStatus& mine,
                               const Heard& h, std::vector<int>& alive) const {
  const int p = comm_.size(), me = comm_.rank();
  std::string what = concat("zcoll: ", mine.in_call ? name_ : "no call", " #", seq_, " (", bytes_, " bytes) on rank ",
                            me, " of ", p);
  switch (reason) {
    // "the timeout of": torch's tests (and users' scripts) look for " timeout " or " Timed out ".
    case FailureReason::kTimeout:
      what += concat(" timed out after ", timeout(), " s, the timeout of its communicator");
      break;
    case FailureReason::kRankLost:
      what += concat(" failed: rank ", peer, " is lost");
      if (!cause.empty()) what += concat(" (", cause, ")");
      break;
    case FailureReason::kPeerFailed: what += concat(" failed: rank ", peer, " ", peer_reason(h.status[peer])); break;
    case FailureReason::kAborted: {
      std::lock_guard<std::mutex> lock(mu_);
      what += concat(" was aborted: ", abort_reason_.empty() ? "by the caller" : abort_reason_);
      break;
    }
    case FailureReason::kTransport: what += concat(" failed on a message with rank ", peer, ": ", cause); break;
    case FailureReason::kLeft:  // announced by a leaving rank, never a failing rank's own reason
    case FailureReason::kNone: break;
  }
  what += ".";
  std::string never;
  for (int r = 0; r < p; ++r) {
    if (h.heard[r]) continue;
    const std::string about = h.left[r] ? concat("it left: ", h.status[r].detail) : comm_.monitor().describe_peer(r);
    if (!h.dead[r] && !h.left[r]) {
      const ProcessState st = comm_.monitor().peer_process(r);
      if (st == ProcessState::kRunning || st == ProcessState::kStopped) alive.push_back(r);
    }
    const std::string state = h.dead[r] ? "lost" + (about.empty() ? "" : ": " + about) : about;
    never += concat(never.empty() ? "" : "; ", "rank ", r, state.empty() ? "" : " (" + state + ")");
  }
  what += never.empty() ? " Every rank was heard from."
                        : concat(" Never arrived (not heard from within ", kGraceNs / 1e9, " s of the failure): ",
                                 never, ".");
  std::map<std::tuple<std::int64_t, std::string, std::int64_t>, std::vector<int>> groups;
  for (int r = 0; r < p; ++r)
    if (h.heard[r] && r != me) groups[{h.status[r].in_call, h.status[r].collective, h.status[r].seq}].push_back(r);
  for (const auto& [key, ranks] : groups) {
    const PeerStatus& s = h.status[ranks.front()];
    const bool same = s.in_call && mine.in_call && s.seq == mine.seq && std::strcmp(s.collective, mine.collective) == 0;
    what += concat(" ", ranks_text(ranks), ranks.size() == 1 ? " was " : " were ", same ? "also " : "", doing(s), ".");
  }
  return what;
}

void Watchdog::fail(FailureReason reason, int peer, const std::string& cause, const PeerStatus* trigger) {
  throw_if_broken();  // a failure while failing (the protocol's own messages) is not reported twice
  const int lost = reason == FailureReason::kRankLost ? peer : -1;
  const PeerStatus mine = my_status(reason, lost);
  try {
    comm_.monitor().announce(mine);  // a. best effort: the channel may itself be what failed
  } catch (const std::exception&) {
  }
  const Heard h = collect(mine, lost, trigger);
  std::vector<int> alive;
  std::string what = describe(reason, trigger ? static_cast<int>(trigger->rank) : peer, cause, mine, h, alive);
  std::string dump;
  if (on_failure) {
    try {
      dump = on_failure(what);
    } catch (const std::exception&) {
    }
  }
  if (!dump.empty()) what += concat(" Flight recorder dump: ", dump, ".");
  // d. broken from now on; one line for launchers; the exception
  FailureInfo info;
  info.collective = mine.in_call ? name_ : "";
  info.seq = seq_;
  info.bytes = bytes_;
  info.dump_path = dump;
  for (int r = 0; r < comm_.size(); ++r) {
    if (!h.heard[r]) info.missing.push_back(r);
    if (h.dead[r]) info.lost.push_back(r);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken_reason_ = what;
    last_failure_ = LastFailure{info, alive};
  }
  broken_.store(true, std::memory_order_release);
  g_broken_count.fetch_add(1, std::memory_order_relaxed);
  std::fprintf(stderr, "ZCOLL-FAILURE rank=%d size=%d kind=%s collective=%s seq=%llu bytes=%zu missing=%s lost=%s dump=%s\n",
               comm_.rank(), comm_.size(), kind_name(reason), mine.in_call ? name_ : "-",
               static_cast<unsigned long long>(seq_), bytes_, list_text(info.missing).c_str(),
               list_text(info.lost).c_str(), dump.empty() ? "-" : dump.c_str());
  std::fflush(stderr);
  if (!info.lost.empty()) throw RankLostError(what, std::move(info));
  throw TimeoutError(what, std::move(info));
}

}  // namespace zcoll
