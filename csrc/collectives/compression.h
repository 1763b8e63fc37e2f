// Compressed allreduce: one entry point, one options struct, one stats struct.
//
//   kind        wire format                                   algorithm (file)
//   kNone       the input dtype                               allreduce(), options.algorithm
//   kFp16/kBf16 2-byte floats, float32 accumulation per hop   compressed ring (allreduce_compressed_ring.cc)
//   kQuantize   blockwise int8 / int4 / 1-bit sign + scales   compressed ring (allreduce_compressed_ring.cc)
//   kTopK       (uint32 index, float32 value) pairs, a fixed  pipelined pair exchange (allreduce_topk.cc)
//               count per segment (blockwise top-k)
//   kThreshold  pairs with |x| > threshold                    sparse allgather (allreduce_sparse.cc)
//   kRandomK    k values at seed-chosen indices, no indices   dense ring over the k values
//   (allreduce_sparse.cc)
//
// Top-k is blockwise (as in several DGC implementations): the tensor is cut into
// topk_segments(count, exact_topk) near-equal segments and each keeps its own k_j = sparse_k(len_j,
// ratio) largest |x|, so a segment can be sent while the next is selected. That is not the
// global top-k: a segment of large values keeps no more than its k_j. exact_topk keeps the
// global top-k (one segment; the selection then finishes before anything is sent).
//
// Every rank ends with the same bits (the compressed ring decodes the same final payload
// everywhere; the sparse paths add the gathered pairs in rank order). Accuracy: see the error
// bounds below and docs/algorithms.md, "Compressed allreduce".
//
// Error feedback (EF-SGD): the caller owns a float32 residual e of `count` elements (zeros at
// first) and passes it in every call for the same tensor. Each rank adds e to its input where
// it first uses it and stores back what its own compression steps lost, so that over steps
// sum(results) + sum over ranks(e) == sum over ranks and steps(inputs) (up to float rounding).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/options.h"

namespace zcoll {

enum class Compression : int {
  kNone = 0,
  kFp16 = 1,
  kBf16 = 2,
  kQuantize = 3,
  kTopK = 4,
  kRandomK = 5,
  kThreshold = 6,
};
inline constexpr int kNumCompressions = 7;

// The kind's name ("none", "fp16", "bf16", "quantize", "topk", "randomk", "threshold"; Python's
// zcoll._C.Compression), and back; both throw std::invalid_argument for what names no kind.
const char* compression_kind_name(Compression kind);
Compression parse_compression_kind(const std::string& name);

struct CompressionOptions {
  Compression kind = Compression::kNone;
  ReduceOp op = ReduceOp::kSum;  // sum or avg (avg: the decoded sum divided by p, in float32)
  // kQuantize (kernels/quantize.h)
  int bits = 8;             // 8, 4 or 1 (sign)
  std::size_t block = 256;  // elements per float32 scale
  bool stochastic = false;  // stochastic rounding (8 and 4 bits)
  std::uint64_t seed = 0;   // stochastic rounding, random-k indices, top-k sampling
  // Sparsifiers (kernels/sparsify.h): k = sparse_k(count, ratio), per segment for kTopK
  double ratio = 0.01;      // kTopK, kRandomK: in (0, 1]
  bool exact_topk = false;  // kTopK: the global top-k (one segment) instead of blockwise
  float threshold = 0.0f;   // kThreshold: keep |x| > threshold (>= 0)
  // Error feedback residual (float32, `count` elements, in/out), or nullptr for none.
  float* residual = nullptr;
  // Fill CompressionStats::error_*: with a residual, from it; without, from a scratch residual
  // started at zero (the same result bits either way). Costs one pass over `count` floats.
  bool measure_error = false;
  // Fill CompressionStats::input_squares / residual_squares from norm_sample elements (0: off):
  // a residual-to-input norm ratio every call for the cost of reading 2 norm_sample floats (the
  // guard of python/zcoll/auto_compression.py; as numpy calls on the hook's worker it cost ~30 us
  // each in a DDP step). The elements: sampled_squares below.
  std::size_t norm_sample = 0;
  Algorithm algorithm = Algorithm::kAuto;  // kNone only
  PipelineOptions pipeline;                // segments of max_segment_bytes of float32 input
  bool check_args = false;                 // as AllreduceOptions::check_args
};

struct CompressionStats {
  std::uint64_t wire_bytes = 0;   // bytes this rank sent during the call (payload and headers)
  std::uint64_t dense_bytes = 0;  // what an uncompressed ring sends per rank: 2(p-1)/p count * dtype size
  // Non-finite values (NaN, Inf) that reached the compressor, found in what every rank
  // receives, so every rank reports the same count: blocks with a NaN scale (kQuantize), 2-byte
  // values (kFp16/kBf16), selected values (sparsifiers; the first rank that sent one in
  // first_nonfinite_rank, else -1). A non-zero count means the result is invalid.
  std::uint64_t nonfinite = 0;
  int first_nonfinite_rank = -1;
  std::uint64_t pairs = 0;      // sparsifiers: pairs selected over all ranks
  bool dense_fallback = false;  // kTopK / kThreshold: pairs > count / 2, a dense ring ran instead
  // With measure_error: this rank's residual after the call (what its compression steps lost
  // in this call; with sparsifiers and error feedback, everything not yet sent).
  double error_max_abs = 0.0;
  double error_l2 = 0.0;
  // With norm_sample: sampled_squares of this rank's input before the call and of its residual
  // after it (0 without a residual).
  double input_squares = 0.0;
  double residual_squares = 0.0;
};

// out = SUM (or AVG) over ranks of in, through the compressed wire format of options.kind.
// dtype float32, float16 or bfloat16; in == out allowed. Bad options or dtype throw
// std::invalid_argument on the calling rank before any communication. Non-finite input does not
// throw: it is reported in stats->nonfinite on every rank.
void allreduce_compressed(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                          const CompressionOptions& options, CompressionStats* stats = nullptr);

// The sum of squares (in double) of `sample` of the `count` elements of x: all of them when
// count <= sample, else kSampleRuns runs of sample / kSampleRuns consecutive elements, run j
// starting at j (count / kSampleRuns), so every part of a bucket (every layer) is represented
// in proportion to its size. float32, float16 or bfloat16.
constexpr std::size_t kSampleRuns = 16;
double sampled_squares(const void* x, std::size_t count, DType dtype, std::size_t sample);

// Throws std::invalid_argument naming the problem (bits, block, ratio, threshold, op, dtype).
void validate(const CompressionOptions& options, DType dtype, std::size_t count);

// k of top-k / random-k: round(ratio * count), at least 1, at most count.
std::size_t sparse_k(std::size_t count, double ratio);

// Segments of the blockwise top-k: S = clamp(floor(count / 2^14), 1, max(8, floor(count / 2^20))),
// 1 when exact: segments of at least 2^14 elements (64 KiB of float32), 8 of them from 128K to 8M
// elements (512 KiB to 32 MiB), about 2^20 elements (4 MiB) each beyond; one below 2^15 elements.
// Segment j = [count j / S, count (j+1) / S) keeps k_j = sparse_k(len_j, ratio) pairs. A function
// of count alone (not of the pipeline's max_segment_bytes), so Python's compress(), every rank
// and every transport setting select the same pairs.
std::size_t topk_segments(std::size_t count, bool exact);

// The documented bound on |result[i] - exact[i]| for op sum over p ranks (divide by p for avg),
// where, under error feedback, "input" means input + residual:
//   kQuantize   p A c + p M 2^-20, A = M = SUM over ranks of max |input| over the block of i,
//               c = 1/(2Q) nearest, 1/Q stochastic (Q = 127 int8, 7 int4), 1 for sign
//   kFp16/kBf16 A ((1 + u)^p - 1) + p M 2^-20 (+ p 2^-25 for fp16 subnormals), A = M =
//               SUM over ranks of |input[i]|, u = 2^-11 (fp16) or 2^-8 (bf16)
//   sparsifiers A + p M 2^-23, A = SUM over ranks of the largest |input| a rank may leave
//               unsent (top-k: its k_j-th largest |input| in the segment j of i; threshold:
//               the threshold; random-k: |input[i]|), M = SUM over ranks of |input[i]|
//   kNone       0 (exact up to the float rounding of the uncompressed algorithm)
// Derivation (docs/algorithms.md): the ring quantizes p times along a chunk's path; each
// quantization of a partial sum v errs by at most c max|v| over the block, and since
// max|D(Q(v))| <= max|v|, every partial sum stays within A.
double compression_error_bound(const CompressionOptions& options, int p, double A, double M);

// "none", "fp16", "bf16", "int8", "int4", "sign", "int8s"/"int4s" (stochastic), "topk:R",
// "topk_exact:R", "randomk:R", "threshold:T"; name() gives the same spelling back.
CompressionOptions parse_compression(const std::string& spec);
std::string compression_name(const CompressionOptions& options);

}  // namespace zcoll
