// Entry points and ISA-independent logic of the sparsifiers (kernels/sparsify.h): argument
// checks, the top-k methods (sampling, nth_element, fix-up to exactly k) and random-k. The passes
// over the whole vector (select, select_ef, scatter_add) come from the kernel table of `impl`.
#include "kernels/sparsify.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "common/check.h"
#include "common/rng.h"
#include "kernels/kernel_table.h"
#include "kernels/quant_math.h"

namespace zcoll::kernels {
namespace {

constexpr std::size_t kAll = std::numeric_limits<std::size_t>::max();
constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();  // no key is > or == this

void check_sizes(std::size_t n, std::size_t k) {
  ZCOLL_REQUIRE(n <= std::numeric_limits<std::uint32_t>::max(), "sparsification indices are uint32: n = ", n,
                " is too large");
  ZCOLL_REQUIRE(k <= n, "k = ", k, " is larger than the number of elements n = ", n);
}

// The key (|x| bits) of the k-th largest of keys[0..m) (1 <= k <= m); reorders keys.
std::uint32_t kth_largest(std::uint32_t* keys, std::size_t m, std::size_t k) {
  std::nth_element(keys, keys + (k - 1), keys + m, std::greater<std::uint32_t>());
  return keys[k - 1];
}

// The r-th largest of keys[0..m) (1 <= r <= m): phase 2's threshold. For small r (8 for a
// segment of 32 K elements at 1%, 32 for 256 K) one scan keeps the r largest so far, sorted; a
// key enters only when it beats their smallest, about r ln(m / r) times in a random order, so the
// scan is mostly one predictable compare per key: 0.35x nth_element's time on 2048 keys (the
// keys keep their order). Larger r falls to nth_element; keys in increasing order (every key
// enters) cost at most r moves each.
std::uint32_t rth_largest(std::uint32_t* keys, std::size_t m, std::size_t r) {
  constexpr std::size_t kScanMax = 64;
  if (r > kScanMax) return kth_largest(keys, m, r);
  std::uint32_t top[kScanMax];
  std::copy(keys, keys + r, top);
  std::sort(top, top + r, std::greater<std::uint32_t>());
  for (std::size_t j = r; j < m; ++j) {
    const std::uint32_t key = keys[j];
    if (key <= top[r - 1]) continue;
    std::size_t p = r - 1;
    for (; p > 0 && top[p - 1] < key; --p) top[p] = top[p - 1];
    top[p] = key;
  }
  return top[r - 1];
}

// The k-th largest t of keys[0..c) (1 <= k <= c, every key >= lo), and the counts of keys > t and
// == t. Candidates are 1.5-3x k (phase 2 places lo so), so the k-th lies within about an octave
// above lo: a histogram of 1024 bins of 1/128 octave (bits 30..16) from lo's bin up (keys beyond
// these 8 octaves share the top bin) is walked up from the bottom to the bin of the (c - k + 1)-th
// smallest, and nth_element runs on that bin's few keys alone. Each pass recomputes the keys
// from the values (one AND) rather than storing them. The former 1/16-octave bins put ~50 keys in
// the k-th's bin and walked down from the top; this takes 0.85x its time on 8 segments of 1 MiB.
std::uint32_t kth_of_candidates(const float* cval, std::size_t c, std::size_t k, std::uint32_t lo,
                                std::size_t* above, std::size_t* equal) {
  constexpr int kShift = 16;
  constexpr std::uint32_t kBins = 1024;
  const std::uint32_t base = lo >> kShift;
  std::uint32_t hist[kBins] = {};
  for (std::size_t j = 0; j < c; ++j)
    ++hist[std::min((qmath::abs_bits(cval[j]) >> kShift) - base, kBins - 1)];
  std::size_t below = 0;
  std::uint32_t bin = 0;
  for (; bin < kBins - 1 && below + hist[bin] <= c - k; ++bin) below += hist[bin];
  const std::size_t members = hist[bin];
  // key in the bin <=> key - first < width (unsigned: keys below first wrap past it; keys are
  // < 2^31, so the top bin's width 2^31 takes every key from first up and none below).
  const std::uint32_t first = (base + bin) << kShift;
  const std::uint32_t width = bin == kBins - 1 ? (1u << 31) : (1u << kShift);
  thread_local std::vector<std::uint32_t> in_bin;
  if (in_bin.size() < members + 1) in_bin.resize(members + 1);
  std::uint32_t* ib = in_bin.data();
  std::size_t nb = 0;
  for (std::size_t j = 0; j < c && nb < members; ++j) {  // branch-free: write, advance on a member
    const std::uint32_t key = qmath::abs_bits(cval[j]);
    ib[nb] = key;
    nb += key - first < width;
  }
  std::size_t over = c - below - members, eq = 0;
  const std::uint32_t t = kth_largest(ib, nb, k - over);
  for (std::size_t j = 0; j < nb; ++j) {
    over += ib[j] > t;
    eq += ib[j] == t;
  }
  *above = over;
  *equal = eq;
  return t;
}

// Exact top-k of x[0..n): threshold key T by nth_element, then one selection pass that keeps
// key > T and the first (k - #(key > T)) elements with key == T.
void topk_exact(const KernelTable& table, const float* x, std::size_t n, std::size_t k, std::uint32_t* idx,
                float* val) {
  std::vector<std::uint32_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = qmath::abs_bits(x[i]);
  const std::uint32_t t = kth_largest(keys.data(), n, k);
  const std::size_t above = static_cast<std::size_t>(
      std::count_if(keys.begin(), keys.begin() + (k - 1), [t](std::uint32_t v) { return v > t; }));
  const std::size_t got = table.select(x, n, t, k - above, idx, val, k);
  ZCOLL_CHECK_EQ(got, k, "exact top-k selected a wrong count");
}

std::size_t sample_size(std::size_t n) {
  return std::min<std::size_t>(65536, std::max<std::size_t>(1024, n / 16));
}

// Sample rank whose key T leaves `sigmas` sigma (and `sigmas` elements) more than k elements
// with key >= T: mu = s k / n of the sample are expected at or above the k-th largest.
std::size_t sample_rank(std::size_t n, std::size_t k, std::size_t s, double sigmas) {
  const double mu = double(s) * double(k) / double(n);
  return static_cast<std::size_t>(std::ceil(mu + sigmas * std::sqrt(mu) + sigmas));
}

// |x| bits at s seeded random positions into keys: uniform over [0, n) (stratified = false), or
// one uniform position in each of s equal strata, in increasing order (stratified = true: no more
// spread than independent draws, and the forward walk lets the hardware prefetch).
template <typename ValueAt>
void sample_keys(std::size_t n, std::size_t s, std::uint64_t seed, ValueAt value_at, std::vector<std::uint32_t>& keys,
                 bool stratified = false) {
  const RngKey key = rng_key(seed);
  keys.resize(s);
  if (!stratified) {
    for (std::size_t j = 0; j < s; ++j)
      keys[j] = qmath::abs_bits(value_at(static_cast<std::size_t>((std::uint64_t(rng_u32(key, j)) * n) >> 32)));
    return;
  }
  // Stratum j is [n j / s, n (j + 1) / s), walked without a division per sample (two 64-bit
  // divisions per position cost more than the load itself when x is in cache): width q or q + 1,
  // the + 1 whenever (rem j mod s) + rem reaches s.
  const std::size_t q = n / s, rem = n % s;
  std::size_t b = 0, acc = 0;
  for (std::size_t j = 0; j < s; ++j) {
    std::size_t width = q;
    acc += rem;
    if (acc >= s) {
      acc -= s;
      ++width;
    }
    const std::size_t pos = b + static_cast<std::size_t>((std::uint64_t(rng_u32(key, j)) * width) >> 32);
    keys[j] = qmath::abs_bits(value_at(pos));
    b += width;
  }
}

bool use_sampled(TopkMethod method, std::size_t n, std::size_t k) {
  return method == TopkMethod::kSampled && n >= 16384 && k <= n / 4;
}

// Phase 2's two thresholds, in sigmas above the expected rank: the first try keeps fewer
// candidates and misses (fewer than k) about once in 100-200 calls at the smallest samples; the
// miss costs one more gather pass at the second, which misses about once in 10^5 (then exact).
constexpr double kFirstSigmas = 2.0, kRetrySigmas = 4.0;

// Phase 4: the k pairs of largest key among the c candidates (index order, every key >= lo).
// The compaction is the select pass over the candidates' values (phase 3's rule with t and an
// equal-key budget of k - above: the first keys == t in index order), which writes candidate
// positions, then mapped to indices: vectorised, where a scalar branch-free loop took 1.5 cycles
// per candidate.
void pick_from_candidates(const KernelTable& table, const std::uint32_t* cidx, const float* cval,
                          std::size_t c, std::size_t k, std::uint32_t lo, std::uint32_t* idx, float* val) {
  std::size_t above = 0, equal = 0;
  const std::uint32_t t = kth_of_candidates(cval, c, k, lo, &above, &equal);
  const std::size_t got = table.select(cval, c, t, k - above, idx, val, k);
  ZCOLL_CHECK_EQ(got, k, "sampled top-k fix-up selected a wrong count");
  for (std::size_t j = 0; j < k; ++j) idx[j] = cidx[idx[j]];
}

// Sampled top-k (sparsify.h, phases 1-4). `gather(t, ...)` runs phase 3 into (cidx, cval, cap):
// every key > t and the first k keys == t (enough for any tie at t: if the k-th largest key is
// t, the result is all keys > t plus the lowest-index keys == t), and returns their count;
// `regather` is the same pass for the retry (topk_ef: over e, which the first pass made r).
// false means "fall back to exact".
template <typename ValueAt, typename Gather, typename Regather>
bool topk_sampled(const KernelTable& table, std::size_t n, std::size_t k, std::uint64_t seed,
                  ValueAt value_at, Gather gather, Regather regather, std::uint32_t* idx, float* val,
                  std::size_t sample) {
  const std::size_t s = std::min(n, sample ? sample : topk_sample_size(n));
  const std::size_t r1 = std::min(s, sample_rank(n, k, s, kFirstSigmas));
  const std::size_t r2 = std::min(s, sample_rank(n, k, s, kRetrySigmas));
  thread_local std::vector<std::uint32_t> skeys, cidx;
  thread_local std::vector<float> cval;
  sample_keys(n, s, seed, value_at, skeys, /*stratified=*/true);
  std::uint32_t t_lo = rth_largest(skeys.data(), s, r1);
  const std::size_t expect = static_cast<std::size_t>(double(n) * double(r2) / double(s));
  const std::size_t cap = std::min(n, 2 * expect + k + 4096);
  if (cidx.size() < cap) {
    cidx.resize(cap);
    cval.resize(cap);
  }
  std::size_t c = gather(t_lo, cidx.data(), cval.data(), cap);
  if (c < k && r2 > r1) {
    t_lo = rth_largest(skeys.data(), s, r2);
    c = regather(t_lo, cidx.data(), cval.data(), cap);
  }
  if (c < k || c > cap) return false;
  pick_from_candidates(table, cidx.data(), cval.data(), c, k, t_lo, idx, val);
  return true;
}

}  // namespace

std::size_t topk_sample_size(std::size_t n) {
  return std::min<std::size_t>(65536, std::max<std::size_t>(512, n / 128));
}

std::size_t topk_sample_share(std::size_t total, std::size_t n) {
  if (total == 0 || n >= total) return topk_sample_size(n);
  const std::size_t share = static_cast<std::size_t>(double(topk_sample_size(total)) * double(n) / double(total));
  return std::clamp<std::size_t>(share, std::min<std::size_t>(256, n), topk_sample_size(n));
}

void topk(const float* x, std::size_t n, std::size_t k, std::uint32_t* idx, float* val, TopkMethod method,
          std::uint64_t seed, KernelImpl impl, std::size_t sample) {
  check_sizes(n, k);
  const KernelTable& table = kernel_table(impl);
  if (k == 0) return;
  auto gather = [&](std::uint32_t t, std::uint32_t* ci, float* cv, std::size_t cap) {
    return table.select(x, n, t, k, ci, cv, cap);
  };
  if (use_sampled(method, n, k) &&
      topk_sampled(table, n, k, seed, [x](std::size_t i) { return x[i]; }, gather, gather, idx, val, sample))
    return;
  topk_exact(table, x, n, k, idx, val);
}

void topk_ef(const float* g, float* e, std::size_t n, std::size_t k, std::uint32_t* idx, float* val,
             TopkMethod method, std::uint64_t seed, KernelImpl impl, std::size_t sample) {
  check_sizes(n, k);
  const KernelTable& table = kernel_table(impl);
  bool done = false;
  if (k > 0 && use_sampled(method, n, k)) {
    // The gather pass also stores r = g + e into e, whatever it returns.
    done = topk_sampled(
        table, n, k, seed, [g, e](std::size_t i) { return g[i] + e[i]; },
        [&](std::uint32_t t, std::uint32_t* ci, float* cv, std::size_t cap) {
          return table.select_ef(g, e, n, t, k, ci, cv, cap);
        },
        [&](std::uint32_t t, std::uint32_t* ci, float* cv, std::size_t cap) {  // e holds r now
          return table.select(e, n, t, k, ci, cv, cap);
        },
        idx, val, sample);
  } else {
    table.select_ef(g, e, n, kNone, kAll, nullptr, nullptr, 0);  // e = r, selects nothing
  }
  if (k > 0 && !done) topk_exact(table, e, n, k, idx, val);
  for (std::size_t j = 0; j < k; ++j) e[idx[j]] = 0.0f;
}

float topk_threshold(const float* x, std::size_t n, std::size_t k, std::uint64_t seed) {
  check_sizes(n, k);
  if (n == 0 || k == 0) return std::numeric_limits<float>::infinity();
  const std::size_t s = std::min(n, sample_size(n));
  std::vector<std::uint32_t> keys;
  sample_keys(n, s, seed, [x](std::size_t i) { return x[i]; }, keys);
  const std::size_t r = std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(double(s) * k / n)));
  return bits_float(kth_largest(keys.data(), s, std::min(r + 1, s)));
}

std::size_t threshold(const float* x, std::size_t n, float t, std::uint32_t* idx, float* val,
                      std::size_t capacity, KernelImpl impl) {
  check_sizes(n, 0);
  ZCOLL_REQUIRE(t >= 0.0f, "threshold must be >= 0 and not NaN, not ", t);
  const KernelTable& table = kernel_table(impl);
  return table.select(x, n, qmath::abs_bits(t), 0, idx, val, capacity);  // -0 counts as 0
}

void randomk(const float* x, std::size_t n, std::size_t k, std::uint64_t seed, std::uint32_t* idx,
             float* val) {
  check_sizes(n, k);
  const RngKey key = rng_key(seed);
  std::vector<std::uint64_t> bits((n + 63) / 64);
  auto test_and_set = [&](std::size_t i) {
    const bool was = (bits[i / 64] >> (i % 64)) & 1u;
    bits[i / 64] |= std::uint64_t(1) << (i % 64);
    return was;
  };
  for (std::size_t j = n - k; j < n; ++j) {  // Floyd: a uniform k-subset in k draws
    const auto t =
        static_cast<std::size_t>((static_cast<unsigned __int128>(rng_u64(key, j)) * (j + 1)) >> 64);
    if (test_and_set(t)) test_and_set(j);
  }
  std::size_t out = 0;
  for (std::size_t w = 0; w < bits.size(); ++w)
    for (std::uint64_t b = bits[w]; b != 0; b &= b - 1) {
      const std::size_t i = w * 64 + static_cast<std::size_t>(__builtin_ctzll(b));
      idx[out] = static_cast<std::uint32_t>(i);
      val[out++] = x[i];
    }
}

void scatter_add(float* y, std::size_t n, const std::uint32_t* idx, const float* val, std::size_t m,
                 KernelImpl impl) {
  const KernelTable& table = kernel_table(impl);
  std::uint32_t top = 0;
  for (std::size_t i = 0; i < m; ++i) top = std::max(top, idx[i]);
  ZCOLL_REQUIRE(m == 0 || top < n, "scatter_add index ", top, " is out of range for ", n, " elements");
  table.scatter_add(y, idx, val, m);
}

}  // namespace zcoll::kernels
