// The wire formats of the compressed ring (RingCodec, compressed.h).
//
// QuantCodec (int8 / int4 / sign): a segment's payload is the one-buffer layout of
//   kernels::quant_layout: codes, then one float32 scale per block. Per segment:
//     encode   quantize, or quantize_ef with a residual                          1 pass
//     combine  dequantize_add_quantize (fused: D(in) + x -> Q), or with a residual
//              dequantize_add into e, then quantize_ef(x, e)                      1 or 2 passes
//     decode   dequantize (+ divide, + cast for 2-byte outputs); counts NaN scales
//   Bytes per element: 1 + 4/block (int8), 0.5 + 4/block (int4), 1/8 + 4/block (sign).
// HalfCodec (fp16 / bf16 on the wire, float32 accumulation): payload = n 2-byte values.
//     combine  widen(in) + x (+ e) in float32, then round once to the wire type.
#include <cstring>
#include <stdexcept>

#include "collectives/compressed.h"
#include "kernels/quantize.h"
#include "kernels/reduce.h"

namespace zcoll::detail {
namespace {

using kernels::QuantParams;

void subtract(float* e, const float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) e[i] -= d[i];
}

class QuantCodec final : public RingCodec {
 public:
  QuantCodec(const CompressionOptions& o, DType dtype, float* tmp) : dtype_(dtype), tmp_(tmp), seed_(o.seed) {
    params_.bits = o.bits;
    params_.block = o.block;
    params_.rounding = o.stochastic ? kernels::Rounding::kStochastic : kernels::Rounding::kNearest;
    kernels::validate(params_);
  }

  std::size_t granule() const override { return params_.block; }
  std::size_t payload_bytes(std::size_t n) const override {
    return kernels::quant_layout(n, params_).total_bytes;
  }

  void encode(const void* x, float* e, std::size_t begin, std::size_t n, int hop, void* payload) override {
    const Payload q = split(payload, n);
    const QuantParams p = at(begin, hop);
    if (e)
      kernels::quantize_ef(x, dtype_, e, n, p, q.codes, q.scales);
    else
      kernels::quantize(x, dtype_, n, p, q.codes, q.scales);
  }

  void combine(const void* in, const void* x, float* e, std::size_t begin, std::size_t n, int hop,
               void* out) override {
    const Payload a = split(const_cast<void*>(in), n), b = split(out, n);
    const QuantParams p = at(begin, hop);
    if (e) {
      kernels::dequantize_add(a.codes, a.scales, n, p, e);
      kernels::quantize_ef(x, dtype_, e, n, p, b.codes, b.scales);
    } else {
      kernels::dequantize_add_quantize(a.codes, a.scales, x, dtype_, n, p, b.codes, b.scales);
    }
  }

  std::size_t decode(const void* payload, std::size_t n, int divisor, void* y) override {
    const Payload q = split(const_cast<void*>(payload), n);
    float* y32 = dtype_ == DType::kFloat32 ? static_cast<float*>(y) : tmp_;
    kernels::dequantize(q.codes, q.scales, n, params_, y32);
    if (divisor > 1) kernels::divide(y32, n, DType::kFloat32, divisor);
    if (y32 != y) kernels::cast(y32, DType::kFloat32, y, dtype_, n);
    return nonfinite(payload, n);
  }

  std::size_t nonfinite(const void* payload, std::size_t n) const override {
    const Payload q = split(const_cast<void*>(payload), n);
    std::size_t bad = 0;
    for (std::size_t b = 0, nb = kernels::num_blocks(n, params_.block); b < nb; ++b)
      bad += q.scales[b] != q.scales[b];
    return bad;
  }

 private:
  struct Payload {
    std::uint8_t* codes;
    float* scales;
  };
  Payload split(void* payload, std::size_t n) const {
    auto* bytes = static_cast<std::uint8_t*>(payload);
    return {bytes, reinterpret_cast<float*>(bytes + kernels::quant_layout(n, params_).scales_offset)};
  }
  QuantParams at(std::size_t begin, int hop) const {
    QuantParams p = params_;
    p.offset = begin;
    p.seed = hop == 0 ? seed_ : mix_seed(seed_, static_cast<std::uint64_t>(hop));  // hop 0: as compress()
    return p;
  }

  DType dtype_;
  float* tmp_;
  std::uint64_t seed_;
  QuantParams params_;
};

class HalfCodec final : public RingCodec {
 public:
  HalfCodec(DType wire, DType dtype, float* tmp, std::size_t max_segment)
      : wire_(wire), dtype_(dtype), a_(tmp), b_(tmp + max_segment) {}

  std::size_t granule() const override { return 16; }
  std::size_t payload_bytes(std::size_t n) const override { return 2 * n; }

  void encode(const void* x, float* e, std::size_t, std::size_t n, int, void* payload) override {
    if (e) {
      kernels::reduce(e, e, as_float(x, n, a_), n, DType::kFloat32, ReduceOp::kSum);
      round_with_residual(e, n, payload);
    } else if (dtype_ == wire_) {
      std::memcpy(payload, x, 2 * n);
    } else {
      kernels::cast(as_float(x, n, a_), DType::kFloat32, payload, wire_, n);
    }
  }

  void combine(const void* in, const void* x, float* e, std::size_t, std::size_t n, int, void* out) override {
    kernels::cast(in, wire_, a_, DType::kFloat32, n);
    kernels::reduce(a_, a_, as_float(x, n, b_), n, DType::kFloat32, ReduceOp::kSum);
    if (e) {
      kernels::reduce(e, a_, e, n, DType::kFloat32, ReduceOp::kSum);
      round_with_residual(e, n, out);
    } else {
      kernels::cast(a_, DType::kFloat32, out, wire_, n);
    }
  }

  std::size_t nonfinite(const void* payload, std::size_t n) const override {
    const auto* h = static_cast<const std::uint16_t*>(payload);
    const std::uint16_t exp = wire_ == DType::kFloat16 ? 0x7c00 : 0x7f80;
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += (h[i] & exp) == exp;
    return bad;
  }

  std::size_t decode(const void* payload, std::size_t n, int divisor, void* y) override {
    const std::size_t bad = nonfinite(payload, n);
    if (dtype_ == wire_ && divisor == 1) {
      std::memcpy(y, payload, 2 * n);
      return bad;
    }
    float* y32 = dtype_ == DType::kFloat32 ? static_cast<float*>(y) : a_;
    kernels::cast(payload, wire_, y32, DType::kFloat32, n);
    if (divisor > 1) kernels::divide(y32, n, DType::kFloat32, divisor);
    if (y32 != y) kernels::cast(y32, DType::kFloat32, y, dtype_, n);
    return bad;
  }

 private:
  const float* as_float(const void* x, std::size_t n, float* scratch) const {
    if (dtype_ == DType::kFloat32) return static_cast<const float*>(x);
    kernels::cast(x, dtype_, scratch, DType::kFloat32, n);
    return scratch;
  }
  // payload = round(r); r (held in e) becomes r - widen(payload).
  void round_with_residual(float* e, std::size_t n, void* payload) {
    kernels::cast(e, DType::kFloat32, payload, wire_, n);
    kernels::cast(payload, wire_, b_, DType::kFloat32, n);
    subtract(e, b_, n);
  }

  DType wire_, dtype_;
  float* a_;
  float* b_;
};

}  // namespace

std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t salt) {
  std::uint64_t z = seed ^ (salt * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::size_t compressed_segment_elements(const PipelineOptions& pipeline, std::size_t granule) {
  const std::size_t bytes = pipeline.max_segment_bytes ? pipeline.max_segment_bytes : default_segment_bytes();
  const std::size_t elems = bytes / sizeof(float) / granule * granule;
  return elems ? elems : granule;
}

std::unique_ptr<RingCodec> make_ring_codec(const CompressionOptions& options, DType dtype, float* tmp,
                                           std::size_t max_segment) {
  switch (options.kind) {
    case Compression::kQuantize:
      return std::make_unique<QuantCodec>(options, dtype, tmp);
    case Compression::kFp16:
      return std::make_unique<HalfCodec>(DType::kFloat16, dtype, tmp, max_segment);
    case Compression::kBf16:
      return std::make_unique<HalfCodec>(DType::kBFloat16, dtype, tmp, max_segment);
    default:
      break;
  }
  throw std::invalid_argument("no ring codec for this compression kind");
}

}  // namespace zcoll::detail
