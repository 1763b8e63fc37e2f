// The entry points of the quantization kernels (kernels/quantize.h): validate the arguments
// (std::invalid_argument, ValueError in Python), handle n == 0, and call the table of `impl`.
#include "kernels/quantize.h"

#include <stdexcept>

#include "common/check.h"
#include "kernels/kernel_table.h"

namespace zcoll::kernels {
namespace {

void validate_float_input(DType dtype, const char* what) {
  ZCOLL_REQUIRE(dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16, what,
                " must be float32, float16 or bfloat16, not ", dtype_name(dtype));
}

}  // namespace

void validate(const QuantParams& p) {
  ZCOLL_REQUIRE(p.bits == 1 || p.bits == 4 || p.bits == 8, "quantization bits must be 8, 4 or 1 (sign), not ",
                p.bits);
  ZCOLL_REQUIRE(p.block > 0, "quantization block must be a positive integer");
  ZCOLL_REQUIRE(p.bits != 4 || p.block % 2 == 0, "4-bit quantization needs an even block size, not ",
                p.block);
  ZCOLL_REQUIRE(p.bits != 1 || p.block % 8 == 0,
                "1-bit quantization needs a block size that is a multiple of 8, not ", p.block);
  ZCOLL_REQUIRE(p.rounding == Rounding::kNearest || p.rounding == Rounding::kStochastic,
                "unknown rounding mode ", static_cast<int>(p.rounding));
  ZCOLL_REQUIRE(p.bits != 1 || p.rounding == Rounding::kNearest,
                "stochastic rounding is defined for 8 and 4 bits, not for 1-bit sign quantization");
}

std::size_t num_blocks(std::size_t n, std::size_t block) {
  ZCOLL_REQUIRE(block > 0, "quantization block size must be positive");
  return n / block + (n % block != 0 ? 1 : 0);
}

std::size_t code_bytes(std::size_t n, int bits) {
  ZCOLL_REQUIRE(bits == 1 || bits == 4 || bits == 8, "quantization bits must be 1, 4 or 8, not ", bits);
  return bits == 8 ? n : bits == 4 ? (n + 1) / 2 : (n + 7) / 8;
}

QuantLayout quant_layout(std::size_t n, const QuantParams& p) {
  validate(p);
  QuantLayout l;
  l.blocks = num_blocks(n, p.block);
  l.code_bytes = code_bytes(n, p.bits);
  l.scales_offset = (l.code_bytes + 3) / 4 * 4;
  l.total_bytes = l.scales_offset + 4 * l.blocks;
  return l;
}

QuantStatus quantize(const void* x, DType dtype, std::size_t n, const QuantParams& p, std::uint8_t* codes,
                     float* scales, KernelImpl impl) {
  validate(p);
  validate_float_input(dtype, "quantize input");
  const KernelTable& k = kernel_table(impl);
  if (n == 0) return {};
  return k.quantize(x, dtype, n, p, codes, scales);
}

void dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, const QuantParams& p, float* y,
                KernelImpl impl) {
  validate(p);
  const KernelTable& k = kernel_table(impl);
  if (n == 0) return;
  k.dequantize(codes, scales, n, p, y, false);
}

void dequantize_add(const std::uint8_t* codes, const float* scales, std::size_t n, const QuantParams& p,
                    float* y, KernelImpl impl) {
  validate(p);
  const KernelTable& k = kernel_table(impl);
  if (n == 0) return;
  k.dequantize(codes, scales, n, p, y, true);
}

QuantStatus dequantize_add_quantize(const std::uint8_t* codes_in, const float* scales_in, const void* x,
                                    DType dtype, std::size_t n, const QuantParams& p, std::uint8_t* codes_out,
                                    float* scales_out, float* sum_out, KernelImpl impl) {
  validate(p);
  validate_float_input(dtype, "dequantize_add_quantize input");
  const KernelTable& k = kernel_table(impl);
  if (n == 0) return {};
  return k.dequantize_add_quantize(codes_in, scales_in, x, dtype, n, p, codes_out, scales_out, sum_out);
}

QuantStatus quantize_ef(const void* g, DType dtype, float* e, std::size_t n, const QuantParams& p,
                        std::uint8_t* codes, float* scales, KernelImpl impl) {
  validate(p);
  validate_float_input(dtype, "quantize_ef gradient");
  const KernelTable& k = kernel_table(impl);
  if (n == 0) return {};
  return k.quantize_ef(g, dtype, e, n, p, codes, scales);
}

void cast(const void* x, DType from, void* y, DType to, std::size_t n, KernelImpl impl) {
  const bool narrow = from == DType::kFloat32 && (to == DType::kFloat16 || to == DType::kBFloat16);
  const bool widen = to == DType::kFloat32 && (from == DType::kFloat16 || from == DType::kBFloat16);
  ZCOLL_REQUIRE(narrow || widen, "cast supports float32 <-> float16 / bfloat16, not ", dtype_name(from),
                " -> ", dtype_name(to));
  const KernelTable& k = kernel_table(impl);
  if (n == 0) return;
  k.cast(x, from, y, to, n);
}

}  // namespace zcoll::kernels
