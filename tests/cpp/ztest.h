// A small self-contained test framework for zcoll's C++ tests (no dependency to install).
//
//   TEST(group, name) { ... }        registers group.name
//   CHECK(cond)                      counts a check; on failure prints file:line and the expression
//   CHECK_EQ(a, b) / _NE / _LT / _LE / _GE / _GT
//                                    ... and both values
//   CHECK_THROWS(statement, Type)    the statement throws Type (or a subclass)
//   FAIL_CHECK(pieces...)            an unconditional failure with a message
//   KNOWN_BUG_TEST(group, name, why) a test that shows a reported, unfixed bug (a strict expected
//                                    failure, pytest's xfail(strict=True)): it runs, its failure
//                                    is reported as XFAIL without failing the run, and once it
//                                    passes (XPASS) the run fails until the mark is removed.
//                                    --known-bugs makes them ordinary tests, failure output shown.
//   ztest::Context c("...");         prefixes failure messages on this thread while alive
//   ON_RANKS(p, options, fn)         zcoll::run_ranks(p, fn, options); a rank's exception (or a
//                                    stall) becomes a failed check naming the rank
//
// Checks may run on rank threads: counters are atomic, messages are printed whole under a lock,
// prefixed by the test's context. A test keeps running after a failed check (the rest of its
// cases still say something); at most kMaxPrinted failures per test are printed.
//
// Command line: zcoll_cpp_tests [--list] [--known-bugs] [PATTERN...]: runs the tests whose
// group.name matches any PATTERN (a glob with * and ?, or else a substring); all tests without
// one. Prints one line per test and a summary "N tests, M checks, F failed"; exits 1 when a
// check failed or no test matched. Group "selftest" (deliberate failures that show what a
// failure report looks like) runs only when a pattern starting with "selftest" names it.
#pragma once
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/inproc_communicator.h"

namespace ztest {

using TestFn = void (*)();
// known_bug: null for a normal test; else what is wrong (KNOWN_BUG_TEST).
bool register_test(const char* group, const char* name, TestFn fn, const char* known_bug = nullptr);

template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Records one check; on failure prints "file:line: [context] message".
void record(bool ok, const char* file, int line, const std::string& message);
inline void record(bool ok, const char* file, int line, const std::function<std::string()>& message) {
  record(ok, file, line, ok ? std::string() : message());
}

// A label for failure messages on this thread (nested contexts are joined with " / ").
class Context {
 public:
  explicit Context(std::string label);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
};
std::string context();

// Values in failure messages: chars as numbers, strings quoted.
template <typename T>
std::string show(const T& v) {
  std::ostringstream os;
  if constexpr (std::is_same_v<T, char> || std::is_same_v<T, signed char> || std::is_same_v<T, unsigned char>)
    os << static_cast<int>(v);
  else if constexpr (std::is_enum_v<T>)
    os << static_cast<long long>(v);
  else if constexpr (std::is_convertible_v<T, std::string>)
    os << '"' << std::string(v) << '"';
  else
    os << v;
  return os.str();
}

void on_ranks(const char* file, int line, int ranks, const zcoll::InProcOptions& options,
              const std::function<void(zcoll::Communicator&)>& fn);

// The in-process options tests use: a stall is reported after 30 s.
zcoll::InProcOptions test_options();

}  // namespace ztest

#define ZTEST_CONCAT2(a, b) a##b
#define ZTEST_CONCAT(a, b) ZTEST_CONCAT2(a, b)

#define ZTEST_FN(group, name) ZTEST_CONCAT(ztest_fn_, ZTEST_CONCAT(group, ZTEST_CONCAT(_, name)))
#define ZTEST_REGISTER(group, name, known_bug)                                                              \
  static void ZTEST_FN(group, name)();                                                                      \
  [[maybe_unused]] static const bool ZTEST_CONCAT(ztest_reg_, ZTEST_CONCAT(group, ZTEST_CONCAT(_, name))) = \
      ::ztest::register_test(#group, #name, &ZTEST_FN(group, name), known_bug);                             \
  static void ZTEST_FN(group, name)()

#define TEST(group, name) ZTEST_REGISTER(group, name, nullptr)
#define KNOWN_BUG_TEST(group, name, why) ZTEST_REGISTER(group, name, why)

#define CHECK(cond) ::ztest::record(static_cast<bool>(cond), __FILE__, __LINE__, "CHECK(" #cond ") failed")

#define ZTEST_CHECK_OP(a, b, op)                                                                            \
  do {                                                                                                      \
    const auto& ztest_a_ = (a);                                                                             \
    const auto& ztest_b_ = (b);                                                                             \
    const bool ztest_ok_ = ztest_a_ op ztest_b_;                                                            \
    ::ztest::record(ztest_ok_, __FILE__, __LINE__, std::function<std::string()>([&] {                       \
                      return ::ztest::str("CHECK(" #a " " #op " " #b ") failed: ", ::ztest::show(ztest_a_), \
                                          " vs ", ::ztest::show(ztest_b_));                                 \
                    }));                                                                                    \
  } while (0)

#define CHECK_EQ(a, b) ZTEST_CHECK_OP(a, b, ==)
#define CHECK_NE(a, b) ZTEST_CHECK_OP(a, b, !=)
#define CHECK_LT(a, b) ZTEST_CHECK_OP(a, b, <)
#define CHECK_LE(a, b) ZTEST_CHECK_OP(a, b, <=)
#define CHECK_GT(a, b) ZTEST_CHECK_OP(a, b, >)
#define CHECK_GE(a, b) ZTEST_CHECK_OP(a, b, >=)

#define FAIL_CHECK(...) ::ztest::record(false, __FILE__, __LINE__, ::ztest::str(__VA_ARGS__))

// The statement throws `type`; anything else (another exception, or none) fails with what it was.
#define CHECK_THROWS(statement, type)                                                              \
  do {                                                                                             \
    std::string ztest_got_ = "no exception";                                                       \
    bool ztest_ok_ = false;                                                                        \
    try {                                                                                          \
      statement;                                                                                   \
    } catch (const type&) {                                                                        \
      ztest_ok_ = true;                                                                            \
    } catch (const std::exception& ztest_e_) {                                                     \
      ztest_got_ = ::ztest::str("a different exception: ", ztest_e_.what());                       \
    } catch (...) {                                                                                \
      ztest_got_ = "an exception not derived from std::exception";                                 \
    }                                                                                              \
    ::ztest::record(ztest_ok_, __FILE__, __LINE__,                                                 \
                    ::ztest::str("CHECK_THROWS(" #statement ", " #type ") failed: ", ztest_got_)); \
  } while (0)

#define ON_RANKS(ranks, options, ...) ::ztest::on_ranks(__FILE__, __LINE__, ranks, options, __VA_ARGS__)
