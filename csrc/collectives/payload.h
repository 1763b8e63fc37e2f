// The payload one rank puts on the wire for a compressed allreduce, and its decode: what the
// Python compressors' compress() / decompress() return. Computed by the code the collectives run
// for one rank's input (compressed.h): the ring codecs' hop-0 encode with error feedback
// (int8 / int4 / sign, fp16 / bf16), the blockwise top-k selection over TopkLayout, the
// threshold / random-k selection. So decompress(compress(x)) on one rank is the one-rank
// allreduce bit for bit, residuals included.
#pragma once
#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <utility>
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

// Leaves bytes uninitialised where std::allocator would zero them (resize): every byte of a
// payload is written by its encode, and zeroing first was a pass over memory as long as the
// encode's own.
template <typename T>
struct UninitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <typename U>
  UninitAllocator(const UninitAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using PayloadBytes = std::vector<unsigned char, UninitAllocator<unsigned char>>;

// One rank's payload: the bytes (in the wire layout of the ring codecs; pairs as
// [uint32 index x m][float32 value x m]) and the arrays they hold.
struct WirePayload {
  Compression kind = Compression::kNone;
  PayloadBytes bytes;
  std::vector<PayloadArray> arrays;
  // Non-finite input that reached the payload, as the collective counts it: blocks with a NaN
  // scale, 2-byte values that are Inf/NaN, selected values that are not finite.
  std::size_t nonfinite = 0;
};

// Encodes `count` elements of x (float32, float16 or bfloat16) with options.kind (not kNone),
// options.seed and options.residual (float32, count elements, updated as the collective updates
// it; null for none). Throws std::invalid_argument for bad options or dtype.
WirePayload encode_payload(const void* x, std::size_t count, DType dtype, const CompressionOptions& options);

// The payload's size in bytes when it is a function of count and the options alone (ring
// codecs, top-k), else 0 (threshold, random-k: their pair counts vary or are not worth fixing).
std::size_t fixed_payload_bytes(std::size_t count, const CompressionOptions& options);

// encode_payload into `p`, a payload of the same fixed size (fixed_payload_bytes): its bytes
// keep their address, so views of them stay valid and nothing is allocated.
void encode_payload_into(WirePayload& p, const void* x, std::size_t count, DType dtype,
                         const CompressionOptions& options);

// y (count elements of dtype) = the tensor a payload of encode_payload(..., count, dtype,
// options) stands for. Returns the payload's non-finite count.
std::size_t decode_payload(const WirePayload& payload, std::size_t count, DType dtype,
                           const CompressionOptions& options, void* y);

}  // namespace zcoll
