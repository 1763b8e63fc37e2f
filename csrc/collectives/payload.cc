// One rank's compressed payload and its decode (payload.h), through the collectives' own
// encode and selection code.
//   ring codecs  make_ring_codec(...)->encode(x, e, 0, count, hop 0): one segment covering the
//                tensor (segments are whole blocks, and the kernels seed by element offset, so
//                this is the bits the ring's per-segment encodes produce); decode likewise
//   top-k        topk_select_segment over TopkLayout, pairs of segment j at offset koff[j]
//   threshold,   select_sparse with capacity count (nothing overflows), compacted to m pairs
//   random-k
//   decode of pairs: zeros, then scatter_add (what every rank does with its own pairs)
#include "collectives/payload.h"

#include <cstdint>
#include <cstring>
#include <memory>

#include "collectives/compressed.h"
#include "common/check.h"
#include "kernels/quantize.h"
#include "kernels/reduce.h"
#include "kernels/sparsify.h"

namespace zcoll {
namespace {

using detail::compressed_by_ring;
using detail::make_ring_codec;

std::size_t count_nonfinite(const float* v, std::size_t m) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < m; ++i) bad += !(v[i] - v[i] == 0.0f);
  return bad;
}

// Pairs laid out as [uint32 index x m][float32 value x m].
void set_pairs(WirePayload& p, std::size_t m) {
  p.bytes.resize(8 * m);
  p.arrays = {{"indices", "u4", 0, m, 4}, {"values", "f4", 4 * m, m, 4}};
}
std::uint32_t* indices(WirePayload& p) { return reinterpret_cast<std::uint32_t*>(p.bytes.data()); }
float* values(WirePayload& p) { return reinterpret_cast<float*>(p.bytes.data() + p.arrays[1].offset); }

kernels::QuantLayout quant_layout_of(std::size_t count, const CompressionOptions& o) {
  kernels::QuantParams q;
  q.bits = o.bits;
  q.block = o.block;
  return kernels::quant_layout(count, q);
}

// The codecs' float32 scratch (2 x count; compressed.h), uninitialised, and only where a codec
// uses it (codecs.cc): decoding into a 2-byte output; half precision's encode of a 2-byte input
// or with a residual. The quantizers read 2-byte inputs themselves.
std::unique_ptr<float[]> ring_scratch(std::size_t count, DType dtype, const CompressionOptions& o, bool encode) {
  const bool wide = dtype != DType::kFloat32;
  const bool needed =
      encode ? o.kind != Compression::kQuantize && (wide || o.residual != nullptr) : wide;
  return std::unique_ptr<float[]>(needed ? new float[2 * count] : nullptr);
}

void encode_ring(WirePayload& p, const void* x, std::size_t count, DType dtype, const CompressionOptions& o) {
  const std::unique_ptr<float[]> tmp = ring_scratch(count, dtype, o, /*encode=*/true);
  auto codec = make_ring_codec(o, dtype, tmp.get(), count);
  p.bytes.resize(codec->payload_bytes(count));
  if (o.kind == Compression::kQuantize) {
    const kernels::QuantLayout l = quant_layout_of(count, o);
    p.arrays = {{"codes", "u1", 0, l.code_bytes, 1}, {"scales", "f4", l.scales_offset, l.blocks, 4}};
    std::memset(p.bytes.data() + l.code_bytes, 0, l.scales_offset - l.code_bytes);  // alignment padding
  } else {
    p.arrays = {{"data", "u2", 0, count, 2}};
  }
  if (count == 0) return;
  codec->encode(x, o.residual, 0, count, /*hop=*/0, p.bytes.data());
  p.nonfinite = codec->nonfinite(p.bytes.data(), count);
}

void encode_topk(WirePayload& p, const void* x, std::size_t count, DType dtype, const CompressionOptions& o) {
  if (count == 0) return set_pairs(p, 0);
  const detail::TopkLayout layout(count, o);
  set_pairs(p, layout.K);
  std::vector<float> w(dtype == DType::kFloat32 ? 0 : layout.longest);
  for (std::size_t j = 0; j < layout.segments(); ++j)
    detail::topk_select_segment(x, dtype, o.residual, layout, j, o.seed, w.data(),
                                indices(p) + layout.koff[j], values(p) + layout.koff[j]);
  p.nonfinite = count_nonfinite(values(p), layout.K);
}

void encode_sparse(WirePayload& p, const void* x, std::size_t count, DType dtype,
                   const CompressionOptions& o) {
  if (count == 0) return set_pairs(p, 0);
  std::vector<float> wide;
  const float* g = static_cast<const float*>(x);
  if (dtype != DType::kFloat32) {
    wide.resize(count);
    kernels::cast(x, dtype, wide.data(), DType::kFloat32, count);
    g = wide.data();
  }
  // Room for every pair it can pick (threshold: every element), so nothing overflows; the pages
  // beyond the pairs picked are never touched.
  set_pairs(p, o.kind == Compression::kRandomK ? sparse_k(count, o.ratio) : count);
  const detail::SparseSelection s =
      detail::select_sparse(g, count, o, o.residual, p.arrays[0].count, indices(p), values(p));
  std::memmove(p.bytes.data() + 4 * s.m, values(p), 4 * s.m);  // compact to m pairs
  set_pairs(p, s.m);
  p.nonfinite = count_nonfinite(values(p), s.m);
}

}  // namespace

WirePayload encode_payload(const void* x, std::size_t count, DType dtype, const CompressionOptions& o) {
  WirePayload p;
  encode_payload_into(p, x, count, dtype, o);
  return p;
}

std::size_t fixed_payload_bytes(std::size_t count, const CompressionOptions& o) {
  if (o.kind == Compression::kQuantize) return quant_layout_of(count, o).total_bytes;
  if (o.kind == Compression::kFp16 || o.kind == Compression::kBf16) return 2 * count;
  if (o.kind == Compression::kTopK) return count ? 8 * detail::TopkLayout(count, o).K : 0;
  return 0;
}

void encode_payload_into(WirePayload& p, const void* x, std::size_t count, DType dtype,
                         const CompressionOptions& o) {
  validate(o, dtype, count);
  ZCOLL_REQUIRE(o.kind != Compression::kNone, "a payload needs a compression kind, not none");
  ZCOLL_REQUIRE(count == 0 || x != nullptr, "encode_payload: null buffer");
  p.kind = o.kind;
  p.nonfinite = 0;
  if (compressed_by_ring(o.kind))
    encode_ring(p, x, count, dtype, o);
  else if (o.kind == Compression::kTopK)
    encode_topk(p, x, count, dtype, o);
  else
    encode_sparse(p, x, count, dtype, o);
}

std::size_t decode_payload(const WirePayload& p, std::size_t count, DType dtype, const CompressionOptions& o,
                           void* y) {
  validate(o, dtype, count);
  ZCOLL_REQUIRE(p.kind == o.kind, "decode_payload: a payload of another compression kind");
  if (count == 0) return 0;
  if (compressed_by_ring(o.kind)) {
    const std::unique_ptr<float[]> tmp = ring_scratch(count, dtype, o, /*encode=*/false);
    auto codec = make_ring_codec(o, dtype, tmp.get(), count);
    ZCOLL_CHECK_EQ(p.bytes.size(), codec->payload_bytes(count), "payload size");
    return codec->decode(p.bytes.data(), count, /*divisor=*/1, y);
  }
  const std::size_t m = p.arrays.at(0).count;
  const auto* idx = reinterpret_cast<const std::uint32_t*>(p.bytes.data());
  const auto* val = reinterpret_cast<const float*>(p.bytes.data() + p.arrays.at(1).offset);
  std::vector<float> wide;
  float* y32 = static_cast<float*>(y);
  if (dtype != DType::kFloat32) {
    wide.resize(count);
    y32 = wide.data();
  }
  std::memset(y32, 0, count * sizeof(float));
  kernels::scatter_add(y32, count, idx, val, m);
  if (dtype != DType::kFloat32) kernels::cast(y32, DType::kFloat32, y, dtype, count);
  return count_nonfinite(val, m);
}

}  // namespace zcoll
