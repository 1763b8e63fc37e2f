// Exception types. Bad user input throws std::invalid_argument (ValueError in Python);
// failures of the transport or of an invariant throw zcoll::Error (zcoll.ZcollError).
#pragma once
#include <stdexcept>
#include <string>

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

}  // namespace zcoll
