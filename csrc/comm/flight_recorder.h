// Flight recorder: the last N collectives of one communicator (ZCOLL_FLIGHT_RECORDER, 256 by
// default; 0: off), in a ring buffer, dumped as JSON when a call fails, on SIGUSR1 and on
// zcoll.dump(); `zcoll report DIR` lines the ranks' dumps up and says where they diverged
// (python/zcoll/flight.py), in the manner of torch's flight-recorder analyzer.
//
// One record per call (collectives/call_scope.h opens it): sequence number, collective,
// algorithm, dtype, count, op, root, state (posted: entered, nothing sent yet; in_progress;
// done; failed), wall-clock start and end, the rank it is waiting for, and per peer the bytes
// posted and completed in each direction (up to kMaxPeers peers; the rest are summed under
// peer -1). The engine's Channel (collectives/pipeline.h) reports every message.
//
// Cost: per call, one coarse wall-clock read at each end and a few stores; per message, a
// lookup among at most kMaxPeers peers and two additions. Off (capacity 0), one branch.
//
// Threads: the communicator's own thread writes; a dump may run on another thread (SIGUSR1's
// dumper, zcoll.dump() while a torch worker runs a collective). Every field is a relaxed atomic
// (plain loads and stores on x86), and each record carries a version that is odd while the
// record is being reused, so a dump skips a record it caught being overwritten.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zcoll {

struct Request;

enum class CallState : int { kPosted = 0, kInProgress, kDone, kFailed };

// A field read and written with relaxed ordering (see the header comment).
template <typename T>
class Relaxed {
 public:
  T get() const { return v_.load(std::memory_order_relaxed); }
  void set(T v) { v_.store(v, std::memory_order_relaxed); }
  void add(T v) { set(get() + v); }  // single writer: no read-modify-write needed

 private:
  std::atomic<T> v_{};
};

// What a record describes (filled by the collective's entry point).
struct CallDescription {
  std::uint64_t seq = 0;
  const char* collective = "";  // string literals
  const char* algorithm = "";
  const char* dtype = "";
  const char* op = "";
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
  int root = -1;
};

class FlightRecorder {
 public:
  static constexpr int kMaxPeers = 8;

  explicit FlightRecorder(std::size_t capacity);
  std::size_t capacity() const { return records_.size(); }
  // Off: calls are not recorded (for the benchmark's on/off comparison; capacity 0 is off too).
  void set_enabled(bool on) { enabled_ = on; }

  // A call starts / ends (state done, or failed when `failed`).
  void begin(const CallDescription& call);
  void end(bool failed);
  void mark_in_progress() {
    if (current_ && current_->state.get() == static_cast<int>(CallState::kPosted))
      current_->state.set(static_cast<int>(CallState::kInProgress));
  }
  // Messages of the current call (the engine's Channel).
  void posted(int peer, std::uint64_t bytes, bool send) {
    if (current_) count(peer, bytes, send, false);
  }
  void completed(int peer, std::uint64_t bytes, bool send) {
    if (current_) count(peer, bytes, send, true);
  }
  void waiting_for(int peer) {
    if (current_) current_->waiting_for.set(peer);
  }

  // The records, oldest first, as a JSON array (safe from any thread).
  std::string json_calls() const;

 private:
  struct Peer {
    Relaxed<int> rank;
    Relaxed<std::uint64_t> sent_posted, sent_done, received_posted, received_done;
  };
  struct Record {
    Relaxed<std::uint64_t> version;  // odd while begin() rewrites the record
    Relaxed<std::uint64_t> seq, count, bytes;
    Relaxed<const char*> collective, algorithm, dtype, op;
    Relaxed<int> root, state, waiting_for, peers_used;
    Relaxed<std::int64_t> start_us, end_us;  // wall clock, microseconds since the epoch
    Peer peers[kMaxPeers + 1];               // the last one sums the peers beyond kMaxPeers
  };
  void count(int peer, std::uint64_t bytes, bool send, bool done);

  std::vector<Record> records_;
  std::atomic<std::uint64_t> calls_{0};  // records begun so far (the next one is calls_ % capacity)
  Record* current_ = nullptr;
  bool enabled_ = true;
};

}  // namespace zcoll
