// Element types and reduction operations, with the one dispatch helper that maps a runtime
// DType onto a C++ type.
//
// The types beyond the eight numeric ones reduce as lanes of a numeric type (reduce_lanes()):
// complex32 / complex64 / complex128 as two float16 / float32 / float64 lanes (sum and avg
// componentwise, as torch and gloo do on the real view; prod, min, max have no meaning), bool as
// one uint8 lane holding 0 or 1 with sum / max -> bor (logical or) and prod / min -> band
// (logical and), so results stay 0 or 1. band / bor / bxor are bitwise, on integers and bool.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/half.h"

namespace zcoll {

enum class DType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 8,         // one byte, 0 or 1 (C++ bool, numpy bool_, torch.bool)
  kComplex32 = 9,    // two float16: real, imaginary (torch.complex32)
  kComplex64 = 10,   // two float32 (std::complex<float>, numpy complex64)
  kComplex128 = 11,  // two float64
};
inline constexpr int kNumDTypes = 12;

enum class ReduceOp : int {
  kSum = 0,
  kProd = 1,
  kMin = 2,
  kMax = 3,
  kAvg = 4,
  kBand = 5,
  kBor = 6,
  kBxor = 7
};
inline constexpr int kNumReduceOps = 8;

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
const char* op_name(ReduceOp op);
bool is_floating(DType dtype);  // float32, float64, float16, bfloat16 (real floating types)
bool is_complex(DType dtype);
bool is_integral(DType dtype);  // the integers and bool: what band / bor / bxor take
// Parse "float32"/"f32"/... and "sum"/...; throw std::invalid_argument listing the valid names.
DType parse_dtype(const std::string& name);
ReduceOp parse_op(const std::string& name);
// Throws std::invalid_argument, naming the dtype and the op, for combinations that have no
// meaning: avg on integers and bool; band / bor / bxor on floating and complex types; prod, min,
// max on complex types.
void validate_op(DType dtype, ReduceOp op);

// How a (valid) dtype and op reduce: `lanes` elements of `dtype` per element of the original,
// with `op`. Numeric types map to themselves; complex to two lanes of their real type; bool to
// uint8 with sum / max -> bor and prod / min -> band. The one place that maps the new types onto
// the numeric kernels (kernels::reduce / divide) and the MPI library's types (MpiTransport).
struct ReduceLanes {
  DType dtype;
  std::size_t lanes;
  ReduceOp op;
};
ReduceLanes reduce_lanes(DType dtype, ReduceOp op);

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) with T the C++ type of dtype (bool: std::uint8_t). Complex types have
// none (std::invalid_argument): the kernels see them as lanes of their real type (reduce_lanes).
template <typename Fn>
decltype(auto) dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(TypeTag<float>{});
    case DType::kFloat64: return fn(TypeTag<double>{});
    case DType::kFloat16: return fn(TypeTag<float16_t>{});
    case DType::kBFloat16: return fn(TypeTag<bfloat16_t>{});
    case DType::kInt8: return fn(TypeTag<std::int8_t>{});
    case DType::kUInt8: return fn(TypeTag<std::uint8_t>{});
    case DType::kInt32: return fn(TypeTag<std::int32_t>{});
    case DType::kInt64: return fn(TypeTag<std::int64_t>{});
    case DType::kBool: return fn(TypeTag<std::uint8_t>{});
    case DType::kComplex32:
    case DType::kComplex64:
    case DType::kComplex128: break;
  }
  throw std::invalid_argument(std::string("dispatch_dtype: ") + dtype_name(dtype) +
                              " has no single C++ type; reduce it as reduce_lanes() says");
}

// The same for the floating types the compression kernels take (float32, float16, bfloat16);
// callers have rejected every other dtype, which would be treated as float32.
template <typename Fn>
decltype(auto) dispatch_float_dtype(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat16) return fn(TypeTag<float16_t>{});
  if (dtype == DType::kBFloat16) return fn(TypeTag<bfloat16_t>{});
  return fn(TypeTag<float>{});
}

}  // namespace zcoll
