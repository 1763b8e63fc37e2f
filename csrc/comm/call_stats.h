// Per-collective counters for metrics (Prometheus, `zcoll monitor`): for each (collective,
// algorithm, size class) of one communicator, the calls, the bytes of this rank's input, the
// seconds spent in them and a histogram of those seconds. Monotonic: link_stats(reset=True)
// does not reset them (a Prometheus counter only grows).
//
// Written by the communicator's own thread when a call leaves (LinkTelemetry::left, which has
// already read the clock: no extra clock read); read from any thread (the metrics sampler) while
// calls run: every field is a relaxed atomic, a bin is filled before `used_` publishes it, and
// bins are never moved (a fixed array), so a reader sees each counter at some recent value.
//
// Cost per call: a search among the bins in use (pointer and integer compares; a job uses a
// handful) and a few additions. Beyond kBins kinds, calls go to the last bin ("other").
#pragma once
#include <atomic>
#include <cstdint>
#include <cstring>

namespace zcoll {

class CallStats {
 public:
  static constexpr int kBins = 48;
  // Duration buckets: bucket k < kBase_ns * 2^k (k < kBuckets - 1); the last is unbounded.
  static constexpr int kBuckets = 24;
  static constexpr std::int64_t kBaseNs = 8192;  // ~8.2 us
  // Size classes by this rank's input bytes: <= 4 KiB, <= 64 KiB, <= 1 MiB, <= 16 MiB, larger.
  static constexpr int kSizeClasses = 5;

  static int size_class(std::uint64_t bytes) {
    int c = 0;
    for (std::uint64_t limit = 4096; c < kSizeClasses - 1 && bytes > limit; limit <<= 4) ++c;
    return c;
  }
  static int bucket(std::int64_t ns) {
    int k = 0;
    for (std::int64_t limit = kBaseNs; k < kBuckets - 1 && ns >= limit; limit <<= 1) ++k;
    return k;
  }

  void record(const char* collective, const char* algorithm, std::uint64_t bytes, std::int64_t ns) {
    Bin* b = find(collective, algorithm, size_class(bytes));
    add(b->calls, 1);
    add(b->bytes, static_cast<std::int64_t>(bytes));
    add(b->sum_ns, ns);
    add(b->buckets[bucket(ns)], 1);
  }

  // The bins in use, each: collective, algorithm, size class, calls, bytes, sum_ns, buckets.
  template <typename F>
  void each(F&& f) const {
    const int used = used_.load(std::memory_order_acquire);
    for (int i = 0; i < used; ++i) {
      const Bin& b = bins_[i];
      std::int64_t buckets[kBuckets];
      for (int k = 0; k < kBuckets; ++k) buckets[k] = b.buckets[k].load(std::memory_order_relaxed);
      f(b.collective, b.algorithm, b.size_class, b.calls.load(std::memory_order_relaxed),
        b.bytes.load(std::memory_order_relaxed), b.sum_ns.load(std::memory_order_relaxed), buckets);
    }
  }

 private:
  struct Bin {
    const char* collective = "";
    const char* algorithm = "";
    int size_class = 0;
    std::atomic<std::int64_t> calls{0}, bytes{0}, sum_ns{0};
    std::atomic<std::int64_t> buckets[kBuckets] = {};
  };
  static void add(std::atomic<std::int64_t>& v, std::int64_t d) {  // single writer
    v.store(v.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
  }
  // The same literal may have another address in another translation unit.
  static bool same(const char* a, const char* b) { return a == b || std::strcmp(a, b) == 0; }
  Bin* find(const char* collective, const char* algorithm, int size_class) {
    const int used = used_.load(std::memory_order_relaxed);
    for (int i = 0; i < used; ++i) {
      Bin& b = bins_[i];
      if (b.size_class == size_class && same(b.collective, collective) && same(b.algorithm, algorithm)) return &b;
    }
    if (used == kBins) return &bins_[kBins - 1];  // full: the last bin takes the rest
    Bin& b = bins_[used];
    b.collective = collective;
    b.algorithm = used == kBins - 1 ? "other" : algorithm;
    b.size_class = size_class;
    used_.store(used + 1, std::memory_order_release);
    return &b;
  }

  Bin bins_[kBins];
  std::atomic<int> used_{0};
};

}  // namespace zcoll
