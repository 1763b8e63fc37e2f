#include "common/dtype.h"

#include <stdexcept>

#include "common/check.h"

namespace zcoll {
namespace {

enum class Kind { kFloating, kInteger, kBool, kComplex };

struct DTypeInfo {
  DType dtype;
  const char* name;
  const char* alias;
  std::size_t size;
  Kind kind;
  DType lane;  // what it reduces as (reduce_lanes): itself, uint8 (bool), the real type (complex)
};

constexpr DTypeInfo kDTypes[kNumDTypes] = {
    {DType::kFloat32, "float32", "f32", 4, Kind::kFloating, DType::kFloat32},
    {DType::kFloat64, "float64", "f64", 8, Kind::kFloating, DType::kFloat64},
    {DType::kFloat16, "float16", "f16", 2, Kind::kFloating, DType::kFloat16},
    {DType::kBFloat16, "bfloat16", "bf16", 2, Kind::kFloating, DType::kBFloat16},
    {DType::kInt8, "int8", "i8", 1, Kind::kInteger, DType::kInt8},
    {DType::kUInt8, "uint8", "u8", 1, Kind::kInteger, DType::kUInt8},
    {DType::kInt32, "int32", "i32", 4, Kind::kInteger, DType::kInt32},
    {DType::kInt64, "int64", "i64", 8, Kind::kInteger, DType::kInt64},
    {DType::kBool, "bool", "b1", 1, Kind::kBool, DType::kUInt8},
    {DType::kComplex32, "complex32", "c32", 4, Kind::kComplex, DType::kFloat16},
    {DType::kComplex64, "complex64", "c64", 8, Kind::kComplex, DType::kFloat32},
    {DType::kComplex128, "complex128", "c128", 16, Kind::kComplex, DType::kFloat64},
};

constexpr const char* kOpNames[kNumReduceOps] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};

const DTypeInfo& info(DType dtype) {
  const int i = static_cast<int>(dtype);
  ZCOLL_REQUIRE(i >= 0 && i < kNumDTypes, "unknown dtype code ", i);
  return kDTypes[i];
}

}  // namespace

std::size_t dtype_size(DType dtype) { return info(dtype).size; }
const char* dtype_name(DType dtype) { return info(dtype).name; }
bool is_floating(DType dtype) { return info(dtype).kind == Kind::kFloating; }
bool is_complex(DType dtype) { return info(dtype).kind == Kind::kComplex; }
bool is_integral(DType dtype) {
  return info(dtype).kind == Kind::kInteger || info(dtype).kind == Kind::kBool;
}

const char* op_name(ReduceOp op) {
  const int i = static_cast<int>(op);
  ZCOLL_REQUIRE(i >= 0 && i < kNumReduceOps, "unknown op code ", i);
  return kOpNames[i];
}

DType parse_dtype(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name || name == d.alias) return d.dtype;
  throw std::invalid_argument(
      "unknown dtype '" + name +
      "'; valid: float32 float64 float16 bfloat16 int8 uint8 int32 int64 bool complex32 "
      "complex64 complex128");
}

ReduceOp parse_op(const std::string& name) {
  for (int i = 0; i < kNumReduceOps; ++i)
    if (name == kOpNames[i]) return static_cast<ReduceOp>(i);
  throw std::invalid_argument("unknown op '" + name + "'; valid: sum prod min max avg band bor bxor");
}

void validate_op(DType dtype, ReduceOp op) {
  op_name(op);
  const bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  ZCOLL_REQUIRE(!(op == ReduceOp::kAvg && is_integral(dtype)),
                "op 'avg' needs a floating or complex dtype, got ", dtype_name(dtype),
                "; use 'sum' and divide yourself");
  ZCOLL_REQUIRE(!bitwise || is_integral(dtype), "op '", op_name(op), "' needs an integer or bool dtype, got ",
                dtype_name(dtype));
  ZCOLL_REQUIRE(!is_complex(dtype) || op == ReduceOp::kSum || op == ReduceOp::kAvg, "op '", op_name(op),
                "' has no meaning for complex dtype ", dtype_name(dtype),
                "; complex types take 'sum' and 'avg'");
}

ReduceLanes reduce_lanes(DType dtype, ReduceOp op) {
  const DTypeInfo& d = info(dtype);
  if (d.kind == Kind::kComplex) return {d.lane, 2, op};
  if (d.kind != Kind::kBool) return {dtype, 1, op};
  switch (op) {  // logical or / and on 0 and 1 (a uint8 sum would give 2, 3, ...: no bool)
    case ReduceOp::kSum:
    case ReduceOp::kMax: return {DType::kUInt8, 1, ReduceOp::kBor};
    case ReduceOp::kProd:
    case ReduceOp::kMin: return {DType::kUInt8, 1, ReduceOp::kBand};
    default: return {DType::kUInt8, 1, op};
  }
}

}  // namespace zcoll
