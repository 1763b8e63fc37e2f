// Exception types. Bad user input throws std::invalid_argument (ValueError in Python);
// failures of the transport or of an invariant throw zcoll::Error (zcoll.ZcollError); a
// collective that other ranks let down throws TimeoutError (zcoll.TimeoutError), after which
// the communicator is broken and every later call throws BrokenError. docs/errors.md lists
// them with the state each leaves.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace zcoll {

// A failed invariant or transport call: something zcoll or MPI did wrong, not the caller.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Ranks disagreed about a collective's arguments (size, dtype, op, root); raised on every rank.
class MismatchError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// What a TimeoutError knows, for programs (Python: attributes of zcoll.TimeoutError).
struct FailureInfo {
  std::string collective;    // "allreduce"
  std::uint64_t seq = 0;     // the communicator's call number (the same on every rank)
  std::uint64_t bytes = 0;   // this rank's buffer
  std::vector<int> missing;  // ranks never heard from (stopped, dead, or not in any zcoll call)
  std::vector<int> lost;     // of those, the ranks whose process is known to be gone
  std::string dump_path;     // the flight recorder's dump of this rank ("" when none)
};

// A collective could not complete because of other ranks: its deadline passed, a peer's
// process died, a peer reported its own failure, or the caller aborted it. Raised on every
// surviving rank; the message names the call, its sequence number, its size and the ranks
// that never arrived.
class TimeoutError : public Error {
 public:
  TimeoutError(const std::string& what, FailureInfo info) : Error(what), info_(std::move(info)) {}
  const FailureInfo& info() const { return info_; }

 private:
  FailureInfo info_;
};

// A TimeoutError whose cause is known without waiting for the deadline: a peer's process is
// gone (info().lost), or the transport reported an error on a message with it.
class RankLostError : public TimeoutError {
 public:
  using TimeoutError::TimeoutError;
};

// A call on a communicator that an earlier TimeoutError broke: messages of the failed call may
// still be posted, so nothing can be matched safely on it again. Create a new communicator.
class BrokenError : public Error {
 public:
  using Error::Error;
};

}  // namespace zcoll
