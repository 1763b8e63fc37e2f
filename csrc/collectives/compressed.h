// Internals of the compressed allreduce (entry point: compression.h): the codec interface the
// compressed ring runs on, the algorithms behind the dispatcher, and the ring allgatherv the
// sparse path uses. Arguments are validated by allreduce_compressed; p >= 1.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/compression.h"

namespace zcoll::detail {

// Whether the compressed ring's codecs carry `kind` (fp16, bf16, quantize), so that the
// hierarchical allreduce can carry it too (the kind table in allreduce_compressed.cc).
bool compressed_by_ring(Compression kind);

// A wire format for the compressed ring, applied to one segment: n elements starting at element
// `begin` of the tensor, begin a multiple of granule(). `x` points at the segment's input
// (input dtype), `e` at its residual (float32) or is null. `hop` numbers the quantizations
// along a chunk's path (0 = the first rank): hop 0 uses options.seed as it is (so one rank
// reproduces the Python compressor's compress() bit for bit), later hops a mixed seed, so
// stochastic rounding draws fresh bits per hop.
class RingCodec {
 public:
  virtual ~RingCodec() = default;
  virtual std::size_t granule() const = 0;
  virtual std::size_t payload_bytes(std::size_t n) const = 0;
  // payload = Q(x + e); e = (x + e) - D(payload)
  virtual void encode(const void* x, float* e, std::size_t begin, std::size_t n, int hop, void* payload) = 0;
  // out = Q(D(in) + x + e); e = (D(in) + x + e) - D(out)
  virtual void combine(const void* in, const void* x, float* e, std::size_t begin, std::size_t n, int hop,
                       void* out) = 0;
  // y (n elements of the output dtype) = D(payload) / divisor, computed in float32. Returns
  // nonfinite(payload, n).
  virtual std::size_t decode(const void* payload, std::size_t n, int divisor, void* y) = 0;
  // Non-finite blocks (quantizers: a NaN scale) or values (half precision) in a payload.
  virtual std::size_t nonfinite(const void* payload, std::size_t n) const = 0;
};

// The codec of options.kind (kQuantize, kFp16, kBf16) for input/output `dtype`. `tmp` is
// float32 scratch of 2 x max_segment elements (segments never exceed max_segment elements).
std::unique_ptr<RingCodec> make_ring_codec(const CompressionOptions& options, DType dtype, float* tmp,
                                           std::size_t max_segment);

// Runs the compressed ring of options.kind; returns the non-finite count of decode() over every
// chunk (identical on every rank).
std::size_t allreduce_compressed_ring(Communicator& comm, const void* in, void* out, std::size_t count,
                                      DType dtype, const CompressionOptions& options, float* residual);

// The hierarchical allreduce with the compressed ring's codec on its inter-node stage
// (allreduce_hierarchical.cc); the compressed ring itself on one node or with one rank per
// node. Needs equal nodes. Returns the non-finite count over every chunk (identical on every rank).
std::size_t allreduce_hierarchical_compressed(Communicator& comm, const void* in, void* out, std::size_t count,
                                              DType dtype, const CompressionOptions& options, float* residual);

// The segments of the blockwise top-k (topk_segments in compression.h), identical on every rank
// and in Python's compress(): segment j = [begin[j], begin[j+1]) keeps k[j] pairs, at pair
// offset koff[j] within a rank's K pairs.
struct TopkLayout {
  std::vector<std::size_t> begin, k, koff;
  std::size_t K = 0, longest = 0;
  TopkLayout(std::size_t count, const CompressionOptions& o);
  std::size_t segments() const { return k.size(); }
  std::size_t len(std::size_t j) const { return begin[j + 1] - begin[j]; }
};

// Selects segment j of `in` (count elements of dtype): its k[j] pairs of largest |x| into
// idx/val with global indices; with a residual (the whole tensor's), error feedback is fused
// (r = g + e, pick, e = r minus what was picked). `w`: float32 scratch of len(j) elements,
// used for 2-byte inputs. allreduce_topk and encode_payload (payload.h) both select with it.
void topk_select_segment(const void* in, DType dtype, float* residual, const TopkLayout& layout, std::size_t j,
                         std::uint64_t seed, float* w, std::uint32_t* idx, float* val);

// Pipelined blockwise top-k (allreduce_topk.cc).
void allreduce_topk(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                    const CompressionOptions& options, float* residual, CompressionStats& stats);

// Threshold / random-k selection from float32 g (n elements) into idx/val (capacity pairs):
// without a residual from g; with one, e += g, then from e, and e = 0 at the picked indices
// (unless the threshold picked more than capacity: overflow, and the caller's dense path
// zeroes e). random-k picks sparse_k(n, ratio) <= capacity pairs with options.seed.
// allreduce_sparse and encode_payload (payload.h) both select with it.
struct SparseSelection {
  std::size_t m = 0;        // pairs picked (threshold: may exceed capacity)
  bool overflow = false;    // m > capacity: only the first capacity pairs were written
  const float* src = nullptr;  // what was selected from: g, or e after e += g
};
SparseSelection select_sparse(const float* g, std::size_t n, const CompressionOptions& options, float* e,
                              std::size_t capacity, std::uint32_t* idx, float* val);

// Threshold and random-k (allreduce_sparse.cc).
void allreduce_sparse(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                      const CompressionOptions& options, float* residual, CompressionStats& stats);

// Ring allgather of variable-size byte blocks in place: block r = buf[offset[r], offset[r] +
// bytes[r]) is this rank's on entry (r = rank), everyone's on exit. Every rank passes the same
// offsets and sizes. Cost: (p-1) alpha + (SUM bytes - bytes[r+1]) beta per rank.
void ring_allgatherv(Communicator& comm, void* buf, const std::size_t* offset, const std::size_t* bytes,
                     const PipelineOptions& pipeline);

// Elements per ring segment: max_segment_bytes of float32 input (at least one granule).
std::size_t compressed_segment_elements(const PipelineOptions& pipeline, std::size_t granule);

// 64-bit mixing for per-hop / per-call seeds.
std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t salt);

}  // namespace zcoll::detail
