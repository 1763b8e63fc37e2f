#include "common/dtype.h"

#include <stdexcept>

#include "common/check.h"

namespace zcoll {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  const char* alias;
  std::size_t size;
  bool floating;
};

constexpr DTypeInfo kDTypes[kNumDTypes] = {
    {DType::kFloat32, "float32", "f32", 4, true},  {DType::kFloat64, "float64", "f64", 8, true},
    {DType::kFloat16, "float16", "f16", 2, true},  {DType::kBFloat16, "bfloat16", "bf16", 2, true},
    {DType::kInt8, "int8", "i8", 1, false},        {DType::kUInt8, "uint8", "u8", 1, false},
    {DType::kInt32, "int32", "i32", 4, false},     {DType::kInt64, "int64", "i64", 8, false},
};

constexpr const char* kOpNames[kNumReduceOps] = {"sum", "prod", "min", "max", "avg"};

const DTypeInfo& info(DType dtype) {
  const int i = static_cast<int>(dtype);
  ZCOLL_REQUIRE(i >= 0 && i < kNumDTypes, "unknown dtype code ", i);
  return kDTypes[i];
}

}  // namespace

std::size_t dtype_size(DType dtype) { return info(dtype).size; }
const char* dtype_name(DType dtype) { return info(dtype).name; }
bool is_floating(DType dtype) { return info(dtype).floating; }

const char* op_name(ReduceOp op) {
  const int i = static_cast<int>(op);
  ZCOLL_REQUIRE(i >= 0 && i < kNumReduceOps, "unknown op code ", i);
  return kOpNames[i];
}

DType parse_dtype(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name || name == d.alias) return d.dtype;
  throw std::invalid_argument("unknown dtype '" + name +
                              "'; valid: float32 float64 float16 bfloat16 int8 uint8 int32 int64");
}

ReduceOp parse_op(const std::string& name) {
  for (int i = 0; i < kNumReduceOps; ++i)
    if (name == kOpNames[i]) return static_cast<ReduceOp>(i);
  throw std::invalid_argument("unknown op '" + name + "'; valid: sum prod min max avg");
}

void validate_op(DType dtype, ReduceOp op) {
  op_name(op);
  ZCOLL_REQUIRE(!(op == ReduceOp::kAvg && !is_floating(dtype)), "op 'avg' needs a floating dtype, got ",
                dtype_name(dtype), "; use 'sum' and divide yourself");
}

}  // namespace zcoll
