#include "reference.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

namespace ref {
namespace {

constexpr double kPi = 3.14159265358979323846;

double smallest_subnormal(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return std::ldexp(1.0, -149);
    case DType::kFloat64:
      return std::numeric_limits<double>::denorm_min();
    case DType::kFloat16:
      return std::ldexp(1.0, -24);
    case DType::kBFloat16:
      return std::ldexp(1.0, -133);
    default:
      return 0.0;
  }
}

// A standard normal value from two uniforms (Box-Muller).
double normal(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  const double u1 = 1.0 - uniform(a, b, c, 1), u2 = uniform(a, b, c, 2);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
}

std::int64_t sign_extend(std::uint64_t bits, std::size_t bytes) {
  if (bytes == 8) return static_cast<std::int64_t>(bits);
  const int shift = 64 - 8 * static_cast<int>(bytes);
  return static_cast<std::int64_t>(bits << shift) >> shift;
}

bool is_signed_int(DType d) { return d == DType::kInt8 || d == DType::kInt32 || d == DType::kInt64; }

}  // namespace

// ---- formats ----------------------------------------------------------------------------------

std::uint64_t encode(double x, Format f) {
  const int bias = (1 << (f.exponent - 1)) - 1, emin = 1 - bias, emax = bias;
  const std::uint64_t sign = std::signbit(x) ? std::uint64_t(1) << (f.exponent + f.mantissa) : 0;
  const std::uint64_t exp_all = ((std::uint64_t(1) << f.exponent) - 1) << f.mantissa;
  const std::uint64_t hidden = std::uint64_t(1) << f.mantissa;
  if (std::isnan(x)) return sign | exp_all | (hidden >> 1);
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | exp_all;
  if (a == 0.0) return sign;
  int e = 0;
  std::frexp(a, &e);                  // a in [2^(e-1), 2^e)
  int q_exp = std::max(e - 1, emin);  // the exponent of the result's leading bit (or emin)
  // Scaling by a power of two is exact; nearbyint rounds to nearest even (default mode).
  auto q = static_cast<std::uint64_t>(std::nearbyint(std::ldexp(a, f.mantissa - q_exp)));
  if (q == 2 * hidden) {  // rounded up to the next binade
    q = hidden;
    ++q_exp;
  }
  if (q_exp > emax) return sign | exp_all;  // overflow: infinity
  if (q < hidden) return sign | q;          // subnormal (q_exp == emin)
  return sign | (static_cast<std::uint64_t>(q_exp + bias) << f.mantissa) | (q - hidden);
}

double decode(std::uint64_t bits, Format f) {
  const int bias = (1 << (f.exponent - 1)) - 1;
  const bool negative = (bits >> (f.exponent + f.mantissa)) & 1;
  const std::uint64_t e = (bits >> f.mantissa) & ((std::uint64_t(1) << f.exponent) - 1);
  const std::uint64_t m = bits & ((std::uint64_t(1) << f.mantissa) - 1);
  double v;
  if (e == (std::uint64_t(1) << f.exponent) - 1) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - f.mantissa);
  } else {
    v = std::ldexp(static_cast<double>((std::uint64_t(1) << f.mantissa) + m),
                   static_cast<int>(e) - bias - f.mantissa);
  }
  return negative ? -v : v;
}

// ---- Buffer -------------------------------------------------------------------------------------

Buffer::Buffer(DType d, std::size_t n, unsigned char fill)
    : dtype(d), count(n), bytes(n * zcoll::dtype_size(d), fill) {}

std::uint64_t Buffer::bits(std::size_t i) const {
  std::uint64_t b = 0;
  std::memcpy(&b, bytes.data() + i * elem_size(), elem_size());  // little-endian
  return b;
}

void Buffer::set_bits(std::size_t i, std::uint64_t b) {
  std::memcpy(bytes.data() + i * elem_size(), &b, elem_size());
}

double Buffer::get(std::size_t i) const {
  const std::uint64_t b = bits(i);
  switch (dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, &b, 4);
      return f;
    }
    case DType::kFloat64: {
      double d;
      std::memcpy(&d, &b, 8);
      return d;
    }
    case DType::kFloat16:
      return decode(b, kHalf);
    case DType::kBFloat16:
      return decode(b, kBFloat16);
    case DType::kUInt8:
      return static_cast<double>(b);
    default:
      return static_cast<double>(sign_extend(b, elem_size()));
  }
}

void Buffer::set(std::size_t i, double v) {
  switch (dtype) {
    case DType::kFloat32: {
      const float f = static_cast<float>(v);
      std::uint64_t b = 0;
      std::memcpy(&b, &f, 4);
      set_bits(i, b);
      return;
    }
    case DType::kFloat64: {
      std::uint64_t b = 0;
      std::memcpy(&b, &v, 8);
      set_bits(i, b);
      return;
    }
    case DType::kFloat16:
      set_bits(i, encode(v, kHalf));
      return;
    case DType::kBFloat16:
      set_bits(i, encode(v, kBFloat16));
      return;
    default:
      set_bits(i, static_cast<std::uint64_t>(static_cast<std::int64_t>(v)));
  }
}

bool Buffer::is_nan(std::size_t i) const { return is_float(dtype) && std::isnan(get(i)); }

// ---- inputs -------------------------------------------------------------------------------------

const char* inputs_name(Inputs inputs) {
  switch (inputs) {
    case Inputs::kExact:
      return "exact";
    case Inputs::kNan:
      return "nan";
    case Inputs::kRandom:
      return "random";
    case Inputs::kBits:
      return "bits";
  }
  return "?";
}

std::uint64_t hash(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  std::uint64_t z = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xd1b54a32d192ed03ull ^
                    (c + 0x8cb92ba72f3d8dd7ull) * 0xbf58476d1ce4e5b9ull ^
                    (d + 0x2545f4914f6cdd1dull) * 0x94d049bb133111ebull;
  for (int round = 0; round < 2; ++round) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
  }
  return z;
}

double uniform(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return std::ldexp(static_cast<double>(hash(a, b, c, d) >> 11), -53);
}

Buffer make_input(Inputs inputs, DType dtype, ReduceOp op, std::size_t count, int rank, int p) {
  Buffer x(dtype, count);
  const auto r = static_cast<std::size_t>(rank), np = static_cast<std::size_t>(p);
  const std::uint64_t salt = static_cast<std::uint64_t>(dtype) * 8 + static_cast<std::uint64_t>(op);
  if (inputs == Inputs::kBits || !is_float(dtype)) {
    for (std::size_t i = 0; i < count; ++i)
      x.set_bits(i, hash(r, i, count, salt + 64 * static_cast<int>(inputs)));
    if (!is_float(dtype)) return x;
    // One element in three a value whose reduction depends on the order: +-0, infinities, NaNs
    // whose payload and sign differ per rank and index.
    const int bits = 8 * static_cast<int>(x.elem_size());
    const std::uint64_t sign = std::uint64_t(1) << (bits - 1);
    const Format f = dtype == DType::kFloat64   ? Format{52, 11}
                     : dtype == DType::kFloat32 ? kSingle
                     : dtype == DType::kFloat16 ? kHalf
                                                : kBFloat16;
    const std::uint64_t inf = ((std::uint64_t(1) << f.exponent) - 1) << f.mantissa;
    const std::uint64_t quiet = std::uint64_t(1) << (f.mantissa - 1);
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint64_t h = hash(r, i, count, salt + 999);
      if (h % 3) continue;
      const std::uint64_t payload = (h >> 32) & (quiet - 1);
      const std::uint64_t special[] = {0, sign, inf | quiet | payload, sign | inf | quiet | (payload >> 1),
                                       inf | ((h >> 20) & 1 ? sign : 0)};
      x.set_bits(i, special[(h >> 8) % 5]);
    }
    return x;
  }
  if (inputs == Inputs::kRandom) {
    for (std::size_t i = 0; i < count; ++i) {
      const double u = uniform(r, i, count, salt + 1000);
      x.set(i, op == ReduceOp::kProd ? (0.5 + 1.5 * u) * (hash(r, i, 7) & 1 ? -1.0 : 1.0) : 2.0 * u - 1.0);
    }
    return x;
  }
  const ReduceOp shape = inputs == Inputs::kNan && op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const double tiny = smallest_subnormal(dtype);
  for (std::size_t i = 0; i < count; ++i) {
    double v;
    if (shape == ReduceOp::kSum || shape == ReduceOp::kAvg) {
      const double small = static_cast<double>((i * 13 + r * 7 + 3) % 17) - 8.0;
      v = small * std::ldexp(1.0, static_cast<int>(i % 11) - 5);
      if (i % 29 == 3) v = -0.0;
      if (i % 31 == 7) v = small * tiny;
    } else if (shape == ReduceOp::kProd) {
      const double sign = (i + r) % 3 == 0 ? -1.0 : 1.0;
      v = sign * std::ldexp(1.0, static_cast<int>((i * 5 + r * 3) % 5) - 2);
    } else {  // min / max
      v = normal(r, i, salt) * 100.0;
      if (i % 37 == 1 && i % np == r) v = std::numeric_limits<double>::infinity();
      if (i % 37 == 2 && (i + 1) % np == r) v = -std::numeric_limits<double>::infinity();
      if (i % 41 == 5 && i % np == r) v = tiny;
      if (i % 41 == 5 && (i + 1) % np == r) v = -tiny;
    }
    x.set(i, v);
    if (x.get(i) == 0.0 && (shape == ReduceOp::kMin || shape == ReduceOp::kMax)) x.set(i, 1.0);
    if (inputs == Inputs::kNan && i % 13 == 0 && (i / 13) % np == r)
      x.set(i, std::numeric_limits<double>::quiet_NaN());
  }
  return x;
}

// ---- references ---------------------------------------------------------------------------------

Buffer reduce_reference(const std::vector<Buffer>& inputs, ReduceOp op) {
  const DType dtype = inputs.at(0).dtype;
  const std::size_t n = inputs[0].count, p = inputs.size();
  Buffer out(dtype, n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!is_float(dtype)) {
      std::int64_t acc = sign_extend(inputs[0].bits(i), out.elem_size());
      if (!is_signed_int(dtype)) acc = static_cast<std::int64_t>(inputs[0].bits(i));
      for (std::size_t r = 1; r < p; ++r) {
        std::int64_t x = is_signed_int(dtype) ? sign_extend(inputs[r].bits(i), out.elem_size())
                                              : static_cast<std::int64_t>(inputs[r].bits(i));
        const auto ua = static_cast<std::uint64_t>(acc), ux = static_cast<std::uint64_t>(x);
        switch (op) {
          case ReduceOp::kSum:
            acc = static_cast<std::int64_t>(ua + ux);
            break;
          case ReduceOp::kProd:
            acc = static_cast<std::int64_t>(ua * ux);
            break;
          case ReduceOp::kMin:
            acc = x < acc ? x : acc;
            break;
          case ReduceOp::kMax:
            acc = x > acc ? x : acc;
            break;
          case ReduceOp::kBand:
            acc = static_cast<std::int64_t>(ua & ux);
            break;
          case ReduceOp::kBor:
            acc = static_cast<std::int64_t>(ua | ux);
            break;
          case ReduceOp::kBxor:
            acc = static_cast<std::int64_t>(ua ^ ux);
            break;
          case ReduceOp::kAvg:
            break;
        }
      }
      out.set_bits(i, static_cast<std::uint64_t>(acc));  // truncated to the element: wraps
      continue;
    }
    double acc = inputs[0].get(i);
    for (std::size_t r = 1; r < p; ++r) {
      const double x = inputs[r].get(i);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          acc = acc + x;
          break;
        case ReduceOp::kProd:
          acc = acc * x;
          break;
        case ReduceOp::kMin:
          acc = (acc < x || std::isnan(acc)) ? acc : x;
          break;
        case ReduceOp::kMax:
          acc = (acc > x || std::isnan(acc)) ? acc : x;
          break;
        case ReduceOp::kBand:  // integers only
        case ReduceOp::kBor:
        case ReduceOp::kBxor:
          break;
      }
    }
    if (op == ReduceOp::kAvg) {
      if (dtype == DType::kFloat64) {
        acc = acc / static_cast<double>(p);
      } else {
        acc = static_cast<double>(static_cast<float>(acc) / static_cast<float>(p));
      }
    }
    out.set(i, acc);
  }
  return out;
}

std::string describe_element(const Buffer& b, std::size_t i) {
  std::ostringstream os;
  os << "0x" << std::hex << b.bits(i) << std::dec << " (";
  os.precision(17);
  os << b.get(i) << ")";
  return os.str();
}

std::string compare_bits(const Buffer& got, const Buffer& expected, bool nan_equal) {
  if (got.count != expected.count || got.dtype != expected.dtype) {
    std::ostringstream os;
    os << "got " << got.count << " elements of " << zcoll::dtype_name(got.dtype) << ", expected "
       << expected.count << " of " << zcoll::dtype_name(expected.dtype);
    return os.str();
  }
  std::size_t bad = 0;
  std::ostringstream detail;
  for (std::size_t i = 0; i < got.count; ++i) {
    if (got.bits(i) == expected.bits(i)) continue;
    if (nan_equal && got.is_nan(i) && expected.is_nan(i)) continue;
    if (++bad <= 3)
      detail << "; at " << i << ": got " << describe_element(got, i) << ", expected "
             << describe_element(expected, i);
  }
  if (!bad) return "";
  std::ostringstream os;
  os << bad << " of " << got.count << " elements differ" << detail.str();
  return os.str();
}

std::size_t block_count(std::size_t count, int p, int r) {
  const auto np = static_cast<std::size_t>(p);
  return count / np + (static_cast<std::size_t>(r) < count % np ? 1 : 0);
}

std::size_t block_begin(std::size_t count, int p, int r) {
  std::size_t begin = 0;
  for (int q = 0; q < r; ++q) begin += block_count(count, p, q);
  return begin;
}

bool is_float(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 || d == DType::kBFloat16;
}

std::vector<DType> all_dtypes() {
  std::vector<DType> v;
  for (int d = 0; d <= static_cast<int>(DType::kInt64); ++d) v.push_back(static_cast<DType>(d));
  return v;
}

std::vector<ReduceOp> ops_for(DType dtype) {
  std::vector<ReduceOp> v = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax};
  if (is_float(dtype)) v.push_back(ReduceOp::kAvg);
  return v;
}

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return std::ldexp(1.0, -24);
    case DType::kFloat64:
      return std::ldexp(1.0, -53);
    case DType::kFloat16:
      return std::ldexp(1.0, -11);
    case DType::kBFloat16:
      return std::ldexp(1.0, -8);
    default:
      return 0.0;
  }
}

}  // namespace ref
