// Element types and reduction operations, with the one dispatch helper that maps a runtime
// DType onto a C++ type.
#pragma once
#include <cstddef>
#include <cstdint>
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
};
inline constexpr int kNumDTypes = 8;

enum class ReduceOp : int { kSum = 0, kProd = 1, kMin = 2, kMax = 3, kAvg = 4 };
inline constexpr int kNumReduceOps = 5;

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
const char* op_name(ReduceOp op);
bool is_floating(DType dtype);
// Parse "float32"/"f32"/... and "sum"/...; throw std::invalid_argument listing the valid names.
DType parse_dtype(const std::string& name);
ReduceOp parse_op(const std::string& name);
// Throws std::invalid_argument for combinations that have no meaning (avg on integers).
void validate_op(DType dtype, ReduceOp op);

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) with T the C++ type of dtype.
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
    case DType::kInt64: break;
  }
  return fn(TypeTag<std::int64_t>{});
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
