// Checked invariants that print file, line and both values (Gloo GLOO_ENFORCE_EQ style).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

#include "common/error.h"

namespace zcoll::detail {

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename A, typename B>
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const A& a, const B& b,
                               const std::string& msg) {
  throw Error(concat(file, ":", line, ": check failed: ", expr, " (", a, " vs ", b, ") ", msg));
}

}  // namespace zcoll::detail

#define ZCOLL_CHECK_OP(a, b, op, ...)                                                          \
  do {                                                                                         \
    const auto& zcoll_a_ = (a);                                                                \
    const auto& zcoll_b_ = (b);                                                                \
    if (!(zcoll_a_ op zcoll_b_))                                                               \
      ::zcoll::detail::check_failed(__FILE__, __LINE__, #a " " #op " " #b, zcoll_a_, zcoll_b_, \
                                    ::zcoll::detail::concat("" __VA_ARGS__));                  \
  } while (0)

#define ZCOLL_CHECK_EQ(a, b, ...) ZCOLL_CHECK_OP(a, b, ==, __VA_ARGS__)
#define ZCOLL_CHECK_LE(a, b, ...) ZCOLL_CHECK_OP(a, b, <=, __VA_ARGS__)
#define ZCOLL_CHECK_LT(a, b, ...) ZCOLL_CHECK_OP(a, b, <, __VA_ARGS__)
#define ZCOLL_CHECK_GE(a, b, ...) ZCOLL_CHECK_OP(a, b, >=, __VA_ARGS__)

// Bad caller input: std::invalid_argument with the message pieces concatenated.
#define ZCOLL_REQUIRE(cond, ...) \
  do {                           \
    if (!(cond)) throw std::invalid_argument(::zcoll::detail::concat(__VA_ARGS__)); \
  } while (0)
