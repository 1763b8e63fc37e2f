// Counter-based random numbers: a pure function of (seed, index), so a result never depends on
// SIMD width, chunking, thread count or device. Used by stochastic rounding, top-k sampling and
// random-k, on the CPU and in CUDA (the functions are __host__ __device__ under nvcc).
//
//   key = rng_key(seed)              splitmix64(seed), split into two 32-bit words k0, k1
//   rng_u32(key, i)                  mix32(mix32(lo32(i) ^ k0) + (hi32(i) ^ k1))
//   rng_uniform(h)                   (h >> 8) * 2^-24, a float in [0, 1) with 24 random bits
//
// mix32 is Wellons' "lowbias32" integer hash (a bijection on 32 bits). All arithmetic is on
// 32-bit unsigned integers, so the SIMD and CUDA copies reproduce it bit for bit.
// Functions have internal linkage (static): every translation unit, whatever its ISA flags,
// keeps its own copy.
#pragma once
#include <cstdint>

#include "common/host_device.h"

namespace zcoll {

struct RngKey {
  std::uint32_t k0, k1;
};

static ZCOLL_HD std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

static ZCOLL_HD RngKey rng_key(std::uint64_t seed) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return RngKey{static_cast<std::uint32_t>(z), static_cast<std::uint32_t>(z >> 32)};
}

// One link of a seed chain: splitmix64's output for z ^ w. A compressor's per-call seed is
// chain_seed(chain_seed(chain_seed(0, seed), crc32(key)), call) (codecs.py, through _C.call_seed).
static ZCOLL_HD std::uint64_t chain_seed(std::uint64_t z, std::uint64_t w) {
  z = (z ^ w) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static ZCOLL_HD std::uint32_t rng_u32(RngKey key, std::uint64_t index) {
  const std::uint32_t h = mix32(static_cast<std::uint32_t>(index) ^ key.k0);
  return mix32(h + (static_cast<std::uint32_t>(index >> 32) ^ key.k1));
}

static ZCOLL_HD float rng_uniform(std::uint32_t h) {
  return static_cast<float>(h >> 8) * 5.9604644775390625e-8f;  // 2^-24
}

// 64 random bits for element `index` (two draws of the 32-bit stream at 2i, 2i+1).
static ZCOLL_HD std::uint64_t rng_u64(RngKey key, std::uint64_t index) {
  return (std::uint64_t(rng_u32(key, 2 * index)) << 32) | rng_u32(key, 2 * index + 1);
}

}  // namespace zcoll
