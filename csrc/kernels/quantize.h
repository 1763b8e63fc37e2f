// Blockwise gradient quantizers and their fused companions: the compute half of compressed
// collectives (the compressed ring, 1-bit Adam style sign compression, error feedback).
//
// ---- Kernels ------------------------------------------------------------------------------
//   quantize                 x -> (codes, scales)                              Q(x)
//   dequantize               (codes, scales) -> y                              y  = D(q)
//   dequantize_add           y += D(q)                                          (y float32)
//   dequantize_add_quantize  s = D(q_in) + x; (codes_out, scales_out) = Q(s)    one ring hop
//   quantize_ef              r = g + e; c = Q(r); e = r - D(c)                  error feedback
//   cast                     float32 <-> float16 / bfloat16 (round to nearest even)
// Every kernel is one sweep over memory: a block (default 256 elements, 1 KiB) is read once from
// DRAM, its absmax taken, then coded from L1. Single-threaded; the caller chunks for threads.
// Phases of a quantizing kernel, per block: 1. absmax pass (|v| bits as integers, + |v| sums for
// sign), 2. scale, 3. code pass (divide, clamp, round, pack; decode for the fused outputs).
// Cost, bytes per element for 8 bits, float32 data (4-bit codes: 0.5, sign: 0.125 instead of 1):
//   quantize 4 read + 1 written; dequantize 1 + 4; dequantize_add 5 + 4;
//   dequantize_add_quantize 5 + 1 (+ 4 with sum_out); quantize_ef 8 + 5; cast 4 + 2.
// Measured with zcoll_kernels_perf (bench/kernels.cc); at 64 MiB all run near memory speed.
//
// ---- Quantizer (QuantParams) --------------------------------------------------------------
// Inputs x, g: float32, float16 or bfloat16 (widened exactly to float32); y, e, s: float32.
// The input is cut into blocks of `block` elements counted from element 0 of the call (the last
// one may be shorter); each block has one float32 scale.
//   bits 8: code = round(x / scale) in [-127, 127], scale = absmax / 127, decode = code * scale
//   bits 4: same with 7 instead of 127, codes in [-7, 7]
//   bits 1: sign (signSGD / 1-bit Adam): scale = mean |x| of the block (summed in a fixed
//           16-lane order, redone on |x| * 2^-64 if the sum overflows, clamped to absmax),
//           bit = x < 0, decode = bit ? -scale : +scale (so -0.0 and +0.0 decode to +scale)
// Rounding: kNearest (ties to even) or kStochastic (8 and 4 bits only): round up with
// probability equal to the fractional part, drawn from a counter-based hash of
// (seed, offset + i) (common/rng.h): unbiased (E[D(Q(x))] = x up to 2^-24 * scale), and
// reproducible for a seed whatever the SIMD width. To quantize a slice [a, b) of a larger
// tensor exactly as the whole would be, start it on a block boundary and pass offset = a.
// The exact formulas are in kernels/quant_math.h.
//
// ---- Payload layout -------------------------------------------------------------------------
//   codes:  bits 8: n bytes, int8, element i in byte i.
//           bits 4: ceil(n/2) bytes; element i in byte i/2, low nibble when i is even, 4-bit
//                   two's complement; an unused final high nibble is 0.
//           bits 1: ceil(n/8) bytes; element i is bit (i % 8) of byte i/8 (LSB first, numpy
//                   packbits(bitorder="little")); unused final bits are 0.
//   scales: num_blocks(n, block) float32, block b covers elements [b*block, min(n, (b+1)*block)).
// `block` must be even for bits 4 and a multiple of 8 for bits 1, so every block starts on a
// byte: the codes of blocks [b0, b1) are one contiguous byte range (a chunk is a payload).
// One-buffer form (quant_layout): codes at offset 0, scales at `scales_offset` (codes rounded
// up to 4 bytes), `total_bytes` in all. The 8-bit payload of 256-blocks is n * 1.0156 bytes.
//
// ---- Error bounds (per element, finite input) ------------------------------------------------
//   nearest 8/4 bits: |x - D(Q(x))| <= absmax / (2 Q) (absmax/254, absmax/14) up to float32
//                     rounding: + absmax * 2^-22, + Q * 2^-149 more when the scale is a
//                     denormal (absmax < Q * 2^-126: its own rounding is then absolute)
//   stochastic:       |x - D(Q(x))| < absmax / Q (one step), unbiased as above
//   sign:             |x - D(Q(x))| = ||x| - mean|x|| <= max(mean, absmax - mean) <= absmax;
//                     the decoded block keeps the block's L1 norm (sum |D| = sum |x|, up
//                     to float32 rounding).
// ---- NaN and Inf ------------------------------------------------------------------------------
// Found for free by the absmax pass (|x| bit patterns compared as integers, NaN > Inf > finite).
// A block holding NaN or +-Inf is not coded: its scale is NaN, its codes 0, its decode NaN (the
// error-feedback residual of that block becomes NaN too). Quantizing kernels return QuantStatus
// counting such blocks; the caller (Python) raises FloatingPointError naming the tensor.
// -0.0 codes as 0 (decodes to +0.0); denormals are quantized like any other value.
//
// ---- Determinism ------------------------------------------------------------------------------
// Every implementation (the scalar reference, the AVX2 and AVX-512 tables, CUDA in csrc/cuda) gives
// bit-identical codes, scales and float outputs: the same IEEE operations in the same order (no
// FMA contraction, the sign mean uses a fixed 16-lane summation order, no float reduction
// elsewhere: absmax is an integer max), checked by tests/compression/test_compression_kernels.py on the CPU
// and by zcoll_cuda_check on a GPU machine. So no tolerance is needed between implementations; only NaN
// payloads are unspecified (a sum of two NaNs may keep either).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/simd_level.h"

namespace zcoll::kernels {

enum class Rounding : int { kNearest = 0, kStochastic = 1 };

struct QuantParams {
  int bits = 8;                            // 8, 4 or 1
  std::size_t block = 256;                 // elements per scale (see layout for bits 4 / 1)
  Rounding rounding = Rounding::kNearest;  // kStochastic: bits 8 and 4 only
  std::uint64_t seed = 0;                  // stochastic rounding stream
  std::uint64_t offset = 0;                // index of element 0 in that stream
};

// What a quantizing kernel saw: blocks holding NaN or Inf (their scale is NaN, see above).
struct QuantStatus {
  std::size_t nonfinite_blocks = 0;
  std::size_t first_nonfinite_block = 0;  // meaningful when nonfinite_blocks > 0
  bool ok() const { return nonfinite_blocks == 0; }
};

struct QuantLayout {
  std::size_t blocks;         // number of scales
  std::size_t code_bytes;     // bytes of codes
  std::size_t scales_offset;  // byte offset of the scales in a one-buffer payload
  std::size_t total_bytes;    // size of a one-buffer payload
};

// Throws std::invalid_argument: bits not in {1, 4, 8}, block 0, block odd for bits 4 or not a
// multiple of 8 for bits 1, stochastic rounding with bits 1.
void validate(const QuantParams& p);
std::size_t num_blocks(std::size_t n, std::size_t block);
std::size_t code_bytes(std::size_t n, int bits);
QuantLayout quant_layout(std::size_t n, const QuantParams& p);

// All kernels validate `p` (and the dtypes) and then run the kernel table `impl` selects
// (kernels/kernel_table.h; kDispatch: simd_level(), which ZCOLL_SIMD caps; kScalar: the
// reference; an ISA this CPU lacks: std::invalid_argument). n == 0 does nothing. Buffers must
// not overlap, except where an argument is documented as in/out.
QuantStatus quantize(const void* x, DType dtype, std::size_t n, const QuantParams& p, std::uint8_t* codes,
                     float* scales, KernelImpl impl = KernelImpl::kDispatch);

void dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, const QuantParams& p, float* y,
                KernelImpl impl = KernelImpl::kDispatch);

// y[i] += D(q)[i] (a multiply then an add, never fused).
void dequantize_add(const std::uint8_t* codes, const float* scales, std::size_t n, const QuantParams& p,
                    float* y, KernelImpl impl = KernelImpl::kDispatch);

// One hop of a compressed ring: s = D(codes_in, scales_in) + x; (codes_out, scales_out) = Q(s);
// also writes s to sum_out when it is not null. Input and output payloads use the same params.
QuantStatus dequantize_add_quantize(const std::uint8_t* codes_in, const float* scales_in, const void* x,
                                    DType dtype, std::size_t n, const QuantParams& p, std::uint8_t* codes_out,
                                    float* scales_out, float* sum_out = nullptr,
                                    KernelImpl impl = KernelImpl::kDispatch);

// Error feedback fused into the compress pass: r = g + e; (codes, scales) = Q(r); e = r - D(Q(r)).
// e (float32, n elements) is in/out. Invariant: D(Q(r)) + e_new == r up to one rounding per
// element, so over steps sum(decoded) + e_final == sum(g) + e_initial.
QuantStatus quantize_ef(const void* g, DType dtype, float* e, std::size_t n, const QuantParams& p,
                        std::uint8_t* codes, float* scales, KernelImpl impl = KernelImpl::kDispatch);

// y = x converted: float32 -> float16 / bfloat16 (round to nearest even, NaN stays a quiet NaN,
// overflow to Inf as IEEE: common/half.h) or float16 / bfloat16 -> float32 (exact). Other pairs:
// invalid_argument. The loop is kernels/elementwise_impl.h's, shared with reduce and divide.
void cast(const void* x, DType from, void* y, DType to, std::size_t n,
          KernelImpl impl = KernelImpl::kDispatch);

}  // namespace zcoll::kernels
