// The payload one rank puts on the wire for a compressed allreduce, and its decode: what the
// Python compressors' compress() / decompress() return. Computed by the code the collectives run
// for one rank's input (compressed.h): the ring codecs' hop-0 encode with error feedback
// (int8 / int4 / sign, fp16 / bf16), the blockwise top-k selection over TopkLayout, the
// threshold / random-k selection. So decompress(compress(x)) on one rank is the one-rank
// allreduce bit for bit, residuals included.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "collectives/compression.h"

namespace zcoll {

// One named array of a payload: `count` items of `itemsize` bytes at byte `offset`. `type` is
// numpy's spelling ("u1" codes, "f4" scales and values, "u4" indices, "u2" 2-byte floats).
struct PayloadArray {
  std::string name;
  std::string type;
  std::size_t offset = 0;
  std::size_t count = 0;
  std::size_t itemsize = 1;
  std::size_t nbytes() const { return count * itemsize; }
};

// One rank's payload: the bytes (in the wire layout of the ring codecs; pairs as
// [uint32 index x m][float32 value x m]) and the arrays they hold.
struct WirePayload {
  Compression kind = Compression::kNone;
  std::vector<unsigned char> bytes;
  std::vector<PayloadArray> arrays;
  // Non-finite input that reached the payload, as the collective counts it: blocks with a NaN
  // scale, 2-byte values that are Inf/NaN, selected values that are not finite.
  std::size_t nonfinite = 0;
};

// Encodes `count` elements of x (float32, float16 or bfloat16) with options.kind (not kNone),
// options.seed and options.residual (float32, count elements, updated as the collective updates
// it; null for none). Throws std::invalid_argument for bad options or dtype.
WirePayload encode_payload(const void* x, std::size_t count, DType dtype, const CompressionOptions& options);

// y (count elements of dtype) = the tensor a payload of encode_payload(..., count, dtype,
// options) stands for. Returns the payload's non-finite count.
std::size_t decode_payload(const WirePayload& payload, std::size_t count, DType dtype,
                           const CompressionOptions& options, void* y);

}  // namespace zcoll
