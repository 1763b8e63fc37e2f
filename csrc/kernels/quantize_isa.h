// The per-ISA entry points behind kernels/quantize.h. They trust their arguments (the dispatcher
// in quantize.cc validated them and handled n == 0); callers outside kernels/ use quantize.h.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/quantize.h"

#define ZCOLL_QUANTIZE_ISA_API                                                                               \
  QuantStatus quantize(const void* x, DType dtype, std::size_t n, const QuantParams& p, std::uint8_t* codes, \
                       float* scales);                                                                       \
  void dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, const QuantParams& p,       \
                  float* y, bool accumulate);                                                                \
  QuantStatus dequantize_add_quantize(const std::uint8_t* codes_in, const float* scales_in, const void* x,   \
                                      DType dtype, std::size_t n, const QuantParams& p,                      \
                                      std::uint8_t* codes_out, float* scales_out, float* sum_out);           \
  QuantStatus quantize_ef(const void* g, DType dtype, float* e, std::size_t n, const QuantParams& p,         \
                          std::uint8_t* codes, float* scales);                                               \
  void cast(const void* x, DType from, void* y, DType to, std::size_t n);

namespace zcoll::kernels {
namespace scalar {
ZCOLL_QUANTIZE_ISA_API
}  // namespace scalar
namespace avx2 {
ZCOLL_QUANTIZE_ISA_API
}  // namespace avx2
namespace avx512 {
ZCOLL_QUANTIZE_ISA_API
}  // namespace avx512
}  // namespace zcoll::kernels
