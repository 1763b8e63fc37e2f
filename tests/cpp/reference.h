// Test data and references, written independently of the library's kernels and conversions:
// typed buffers, the half-precision encodings (a generic round-to-nearest-even encoder), inputs
// that are exact in every summation order, and reductions as plain loops in rank order.
//
// Inputs (the rules of tests/mpi/collectives.py, as functions of (rank, index)):
//   integers        any bit pattern: wrap-around + and * do not depend on the order
//   float sum/avg   small integers (-8..8) times 2^(i % 11 - 5), one power shared by every rank
//                   at an index, so every partial sum is an integer <= 64 times that power:
//                   exact even in bfloat16; -0.0 on every rank where i % 29 == 3 (sums stay
//                   -0.0 only if no one starts from +0.0); small multiples of the smallest
//                   subnormal where i % 31 == 7
//   float prod      +-2^k, k in -2..2: every partial product of 8 ranks is within 2^-6..2^6
//   float min/max   any values and +-inf, +-smallest subnormal, but no zeros or NaNs (the
//                   result of min(-0, +0) and of two NaNs depends on the order)
//   avg             the exact sum divided by p in the dtype (halves: in float32, rounded once)
//   nan             the sum/max inputs with a NaN on one rank at every 13th index
//   random          floats uniform in [-1, 1): checked within (p + 1) u SUM |x| of the exact sum
//   bits            any bit pattern, NaNs included (copying collectives; reductions: no right
//                   answer for floats, only the same bits on every rank)
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace ref {

using zcoll::DType;
using zcoll::ReduceOp;

// IEEE binary formats with `mantissa` stored bits and `exponent` bits.
struct Format {
  int mantissa, exponent;
};
inline constexpr Format kHalf{10, 5}, kBFloat16{7, 8}, kSingle{23, 8};
// x rounded to nearest even in `f`, as its bit pattern (NaN: a quiet NaN; overflow: inf).
std::uint64_t encode(double x, Format f);
double decode(std::uint64_t bits, Format f);

// A buffer of `count` elements of `dtype`, read and written as doubles or as bit patterns.
struct Buffer {
  DType dtype = DType::kFloat32;
  std::size_t count = 0;
  std::vector<unsigned char> bytes;

  Buffer() = default;
  Buffer(DType d, std::size_t n, unsigned char fill = 0);
  std::size_t elem_size() const { return zcoll::dtype_size(dtype); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  std::uint64_t bits(std::size_t i) const;
  void set_bits(std::size_t i, std::uint64_t b);
  double get(std::size_t i) const;    // integers: their value; floats: exactly
  void set(std::size_t i, double v);  // floats: rounded to nearest even; integers: truncated
  bool is_nan(std::size_t i) const;
};

enum class Inputs { kExact, kNan, kRandom, kBits };
const char* inputs_name(Inputs inputs);

// 64 pseudo-random bits from the arguments (splitmix64 of their mix).
std::uint64_t hash(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0, std::uint64_t d = 0);
// In [0, 1).
double uniform(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0, std::uint64_t d = 0);

// Rank `rank`'s input of a case (see the rules above). `op` matters for floating exact inputs.
Buffer make_input(Inputs inputs, DType dtype, ReduceOp op, std::size_t count, int rank, int p);

// OP over the inputs in rank order, with zcoll's semantics (integers wrap; min/max keep a NaN;
// avg divides the sum by p in the dtype), computed exactly in double (or uint64 for integers)
// and stored once: the right answer only where every order gives the same bits.
Buffer reduce_reference(const std::vector<Buffer>& inputs, ReduceOp op);

// Where two buffers differ bitwise: "" when equal, else "k of n elements differ; at i: got
// 0x.. (v), expected 0x.. (v); ...". With nan_equal, any NaN matches any NaN.
std::string compare_bits(const Buffer& got, const Buffer& expected, bool nan_equal = false);
std::string describe_element(const Buffer& b, std::size_t i);

// reduce_scatter's block layout, written out again: the first count % p ranks hold one more.
std::size_t block_begin(std::size_t count, int p, int r);
std::size_t block_count(std::size_t count, int p, int r);

bool is_float(DType dtype);
// The eight numeric dtypes (bool and complex: test_dtypes.cc, which reduces them as lanes of these).
std::vector<DType> all_dtypes();
std::vector<ReduceOp> ops_for(DType dtype);
// The unit roundoff of a floating dtype (2^-24, 2^-53, 2^-11, 2^-8).
double unit_roundoff(DType dtype);

}  // namespace ref
