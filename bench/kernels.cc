// zcoll_kernels_perf: single-core throughput of the CPU kernels (kernels/reduce.h,
// kernels/quantize.h, kernels/sparsify.h) next to memcpy measured in the same run, for the kernel
// table --impl names (kernels/kernel_table.h).
//
// Purpose: say how close each kernel runs to memory speed, in GB/s of float32 input (4 bytes per
// element, GB = 1e9 B; a row on 16-bit data counts its elements the same way) and as a ratio to
// memcpy of the same float32 buffer.
// Method:
//   1. per size: N(0,1)-like data with per-256-block magnitudes spread over 1e-3..1e3;
//   2. check: every kernel once with the chosen implementation and once with the scalar
//      reference; #wrong counts output bytes that differ (0 expected: they are bit-identical);
//   3. timing: R rounds; each round runs every kernel once, in turn (memcpy included), so a
//      noisy neighbour slows all of them alike; a row reports the median round. Small sizes
//      repeat each call inside a round (>= ~200 us) and stay in cache; 64 MiB runs from DRAM.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/half.h"
#include "kernels/kernel_table.h"
#include "kernels/quantize.h"
#include "kernels/reduce.h"
#include "kernels/simd_level.h"
#include "kernels/sparsify.h"

namespace {
using namespace zcoll;
using namespace zcoll::kernels;

struct Options {
  std::vector<std::size_t> sizes{256u << 10, 64u << 20};
  int rounds = 11;
  KernelImpl impl = KernelImpl::kDispatch;
  std::string only;  // comma-separated substrings of kernel names
  double density = 0.01;
  bool check = true;
};

void usage() {
  std::puts(
      "usage: zcoll_kernels_perf [-s SIZES] [-r ROUNDS] [-i IMPL] [-k NAMES] [-d DENSITY] [--no-check]\n"
      "Single-core throughput of the CPU kernels, GB/s of float32 input, next to memcpy.\n"
      "  -s, --sizes SIZES    comma-separated byte sizes of the float32 input, K/M/G suffixes\n"
      "                       (default 256K,64M)\n"
      "  -r, --rounds N       timing rounds, the median is reported (default 11)\n"
      "  -i, --impl IMPL      dispatch|scalar|avx2|avx512 (default dispatch = ZCOLL_SIMD / CPU)\n"
      "  -k, --kernels NAMES  only rows whose name contains one of these comma-separated words\n"
      "  -d, --density F      fraction kept by top-k / threshold / random-k (default 0.01)\n"
      "      --no-check       skip the comparison with the scalar reference (#wrong column)\n"
      "  -h, --help           this text\n"
      "Targets at 64M: int8 quantize >= 0.6x memcpy, dequantize+add >= 0.7x, top-k 1% sampled >= 0.3x.");
}

std::size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  const char unit = end && *end ? static_cast<char>(*end | 0x20) : 'b';
  if (unit == 'k') v *= 1024;
  if (unit == 'm') v *= 1024 * 1024;
  if (unit == 'g') v *= 1024.0 * 1024 * 1024;
  if (!(v >= 4)) throw std::invalid_argument("bad size '" + s + "' (at least 4 bytes: one float)");
  return static_cast<std::size_t>(v);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t a = 0;
  while (a <= s.size()) {
    const std::size_t b = std::min(s.find(',', a), s.size());
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
    } else if (a == "-s" || a == "--sizes") {
      o.sizes.clear();
      for (const auto& s : split(value())) o.sizes.push_back(parse_size(s));
    } else if (a == "-r" || a == "--rounds") {
      o.rounds = std::max(1, std::atoi(value().c_str()));
    } else if (a == "-i" || a == "--impl") {
      o.impl = parse_kernel_impl(value());
    } else if (a == "-k" || a == "--kernels") {
      o.only = value();
    } else if (a == "-d" || a == "--density") {
      o.density = std::atof(value().c_str());
      if (!(o.density > 0 && o.density <= 0.25)) throw std::invalid_argument("density must be in (0, 0.25]");
    } else if (a == "--no-check") {
      o.check = false;
    } else {
      throw std::invalid_argument("unknown flag '" + a + "' (see --help)");
    }
  }
  return o;
}

// One row: run(impl) does the work once; reset() restores what run() modifies in place;
// output() is the bytes the check compares. reset_each_call: repeated runs would drift into
// data that times differently (divide shrinks values into denormals), so the timing resets
// before every call, outside the timed region.
struct Kernel {
  std::string name;
  std::function<void(KernelImpl)> run;
  std::function<void()> reset;
  std::function<std::vector<std::uint8_t>()> output;
  bool reset_each_call = false;
};

template <typename T>
std::vector<std::uint8_t> bytes_of(const std::vector<T>& v, std::size_t count = ~std::size_t(0)) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
  return std::vector<std::uint8_t>(p, p + std::min(count, v.size()) * sizeof(T));
}
template <typename A, typename B>
std::vector<std::uint8_t> concat(const A& a, const B& b) {
  std::vector<std::uint8_t> out = bytes_of(a);
  const auto tail = bytes_of(b);
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

// Every buffer of one size, allocated and touched once.
struct Data {
  std::size_t n, k;
  std::vector<float> x, x2, y, y0, e, e0, dst;
  std::vector<std::uint8_t> c8, c4, c1, cin8, cin4, cout8;
  std::vector<float> s, sin8, sin4, sout;
  std::vector<std::uint16_t> h;
  std::vector<bfloat16_t> bx, bx2;  // x, x2 rounded to bfloat16 / float16 (reduce, divide inputs)
  std::vector<float16_t> fx, fx2;
  std::vector<std::uint16_t> hio;  // in/out of divide
  std::vector<std::uint32_t> idx, sidx;  // outputs; scatter-add input (random-k indices)
  std::vector<float> val, sval;
  float thr = 0;
  std::size_t count = 0;  // threshold's count

  std::size_t capacity() const { return std::min(n, 4 * k + 1024); }
  Data(std::size_t n_, double density) : n(n_), k(std::max<std::size_t>(1, std::size_t(n_ * density))) {
    std::mt19937 gen(12345);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> mag(-3, 3);
    x.resize(n);
    x2.resize(n);
    for (std::size_t b = 0; b < n; b += 256) {
      const float m = std::pow(10.0f, mag(gen));
      for (std::size_t i = b; i < std::min(n, b + 256); ++i) {
        x[i] = normal(gen) * m;
        x2[i] = normal(gen) * m;
      }
    }
    y0.assign(n, 0.5f);
    y = y0;
    e0.assign(n, 0.0f);
    for (std::size_t i = 0; i < n; i += 7) e0[i] = x2[i] * 0.01f;
    e = e0;
    dst.assign(n, 0.0f);
    const std::size_t nb = num_blocks(n, 256);
    c8.assign(n, 0);
    c4.assign(code_bytes(n, 4), 0);
    c1.assign(code_bytes(n, 1), 0);
    cout8.assign(n, 0);
    s.assign(nb, 0.0f);
    sout.assign(nb, 0.0f);
    sin8.assign(nb, 0.0f);
    sin4.assign(nb, 0.0f);
    cin8.assign(n, 0);
    cin4.assign(code_bytes(n, 4), 0);
    quantize(x2.data(), DType::kFloat32, n, QuantParams{8}, cin8.data(), sin8.data(), KernelImpl::kScalar);
    quantize(x2.data(), DType::kFloat32, n, QuantParams{4}, cin4.data(), sin4.data(), KernelImpl::kScalar);
    h.assign(n, 0);
    bx.resize(n);
    bx2.resize(n);
    fx.resize(n);
    fx2.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      bx[i] = from_float<bfloat16_t>(x[i]);
      bx2[i] = from_float<bfloat16_t>(x2[i]);
      fx[i] = from_float<float16_t>(x[i] * 1e-3f);  // mostly within float16's range
      fx2[i] = from_float<float16_t>(x2[i] * 1e-3f);
    }
    hio.assign(reinterpret_cast<const std::uint16_t*>(bx.data()),
               reinterpret_cast<const std::uint16_t*>(bx.data()) + n);
    idx.assign(capacity(), 0);
    val.assign(capacity(), 0.0f);
    sidx.assign(k, 0);
    sval.assign(k, 0.0f);
    randomk(x2.data(), n, k, 5, sidx.data(), sval.data());
    thr = topk_threshold(x.data(), n, k, 1);
  }
};

std::vector<Kernel> kernels(Data& d, double density) {
  const std::size_t n = d.n;
  const QuantParams q8{8}, q4{4}, q1{1}, sr8{8, 256, Rounding::kStochastic, 7};
  auto none = [] {};
  std::vector<Kernel> ks;
  ks.push_back({"memcpy", [&d, n](KernelImpl) { std::memcpy(d.dst.data(), d.x.data(), n * 4); }, none,
                [&d] { return bytes_of(d.dst); }});
  auto quant = [&](const char* name, QuantParams p, std::vector<std::uint8_t>* codes) {
    ks.push_back({name,
                  [&d, n, p, codes](KernelImpl i) {
                    quantize(d.x.data(), DType::kFloat32, n, p, codes->data(), d.s.data(), i);
                  },
                  [] {}, [&d, codes] { return concat(*codes, d.s); }});
  };
  ks.push_back({"reduce sum float32",
                [&d, n](KernelImpl i) {
                  reduce(d.dst.data(), d.x.data(), d.x2.data(), n, DType::kFloat32, ReduceOp::kSum, i);
                },
                none, [&d] { return bytes_of(d.dst); }});
  ks.push_back({"reduce sum bfloat16",
                [&d, n](KernelImpl i) {
                  reduce(d.h.data(), d.bx.data(), d.bx2.data(), n, DType::kBFloat16, ReduceOp::kSum, i);
                },
                none, [&d] { return bytes_of(d.h); }});
  ks.push_back({"reduce max float16",
                [&d, n](KernelImpl i) {
                  reduce(d.h.data(), d.fx.data(), d.fx2.data(), n, DType::kFloat16, ReduceOp::kMax, i);
                },
                none, [&d] { return bytes_of(d.h); }});
  ks.push_back({"divide bfloat16 by 3 (avg)",
                [&d, n](KernelImpl i) { divide(d.hio.data(), n, DType::kBFloat16, 3, i); },
                [&d, n] {
                  const auto* b = reinterpret_cast<const std::uint16_t*>(d.bx.data());
                  d.hio.assign(b, b + n);
                },
                [&d] { return bytes_of(d.hio); }, /*reset_each_call=*/true});
  quant("quantize int8", q8, &d.c8);
  quant("quantize int8 stochastic", sr8, &d.c8);
  quant("quantize int4", q4, &d.c4);
  quant("quantize sign (1 bit)", q1, &d.c1);
  ks.push_back({"dequantize int8",
                [&d, n, q8](KernelImpl i) { dequantize(d.cin8.data(), d.sin8.data(), n, q8, d.y.data(), i); },
                [&d] { d.y = d.y0; }, [&d] { return bytes_of(d.y); }});
  ks.push_back(
      {"dequantize+add int8",
       [&d, n, q8](KernelImpl i) { dequantize_add(d.cin8.data(), d.sin8.data(), n, q8, d.y.data(), i); },
       [&d] { d.y = d.y0; }, [&d] { return bytes_of(d.y); }});
  ks.push_back(
      {"dequantize+add int4",
       [&d, n, q4](KernelImpl i) { dequantize_add(d.cin4.data(), d.sin4.data(), n, q4, d.y.data(), i); },
       [&d] { d.y = d.y0; }, [&d] { return bytes_of(d.y); }});
  ks.push_back({"dequantize+add+quantize int8 (ring hop)",
                [&d, n, q8](KernelImpl i) {
                  dequantize_add_quantize(d.cin8.data(), d.sin8.data(), d.x.data(), DType::kFloat32, n, q8,
                                          d.cout8.data(), d.sout.data(), nullptr, i);
                },
                none, [&d] { return concat(d.cout8, d.sout); }});
  ks.push_back({"quantize int8 + error feedback",
                [&d, n, q8](KernelImpl i) {
                  quantize_ef(d.x.data(), DType::kFloat32, d.e.data(), n, q8, d.c8.data(), d.s.data(), i);
                },
                [&d] { d.e = d.e0; }, [&d] { return concat(d.e, d.c8); }});
  ks.push_back(
      {"cast float32 -> bfloat16",
       [&d, n](KernelImpl i) { cast(d.x.data(), DType::kFloat32, d.h.data(), DType::kBFloat16, n, i); }, none,
       [&d] { return bytes_of(d.h); }});
  ks.push_back(
      {"cast float32 -> float16",
       [&d, n](KernelImpl i) { cast(d.x.data(), DType::kFloat32, d.h.data(), DType::kFloat16, n, i); }, none,
       [&d] { return bytes_of(d.h); }});
  ks.push_back(
      {"cast bfloat16 -> float32",
       [&d, n](KernelImpl i) { cast(d.bx.data(), DType::kBFloat16, d.dst.data(), DType::kFloat32, n, i); },
       none, [&d] { return bytes_of(d.dst); }});
  char pct_buf[32];
  std::snprintf(pct_buf, sizeof pct_buf, "%g%%", 100.0 * density);
  const std::string pct = pct_buf;
  ks.push_back({"top-k " + pct + " sampled",
                [&d, n](KernelImpl i) {
                  topk(d.x.data(), n, d.k, d.idx.data(), d.val.data(), TopkMethod::kSampled, 1, i);
                },
                none,
                [&d] {
                  return concat(std::vector<std::uint32_t>(d.idx.begin(), d.idx.begin() + d.k),
                                std::vector<float>(d.val.begin(), d.val.begin() + d.k));
                }});
  ks.push_back({"top-k " + pct + " exact (nth_element)",
                [&d, n](KernelImpl i) {
                  topk(d.x.data(), n, d.k, d.idx.data(), d.val.data(), TopkMethod::kExact, 1, i);
                },
                none,
                [&d] {
                  return concat(std::vector<std::uint32_t>(d.idx.begin(), d.idx.begin() + d.k),
                                std::vector<float>(d.val.begin(), d.val.begin() + d.k));
                }});
  ks.push_back(
      {"top-k " + pct + " sampled + error feedback",
       [&d, n](KernelImpl i) {
         topk_ef(d.x.data(), d.e.data(), n, d.k, d.idx.data(), d.val.data(), TopkMethod::kSampled, 1, i);
       },
       [&d] { d.e = d.e0; },
       [&d] { return concat(d.e, std::vector<std::uint32_t>(d.idx.begin(), d.idx.begin() + d.k)); }});
  ks.push_back({"threshold (about " + pct + ")",
                [&d, n](KernelImpl i) {
                  d.count = threshold(d.x.data(), n, d.thr, d.idx.data(), d.val.data(), d.capacity(), i);
                },
                none, [&d] { return bytes_of(d.idx, d.count); }});
  ks.push_back({"random-k " + pct,
                [&d, n](KernelImpl) { randomk(d.x.data(), n, d.k, 3, d.idx.data(), d.val.data()); }, none,
                [&d] { return bytes_of(d.idx, d.k); }});
  ks.push_back({"scatter-add " + pct + " (per dense element)",
                [&d, n](KernelImpl i) { scatter_add(d.y.data(), n, d.sidx.data(), d.sval.data(), d.k, i); },
                [&d] { d.y = d.y0; }, [&d] { return bytes_of(d.y); }});
  return ks;
}

bool selected(const std::string& name, const std::string& only) {
  if (name == "memcpy" || only.empty()) return true;
  for (const auto& w : split(only))
    if (name.find(w) != std::string::npos) return true;
  return false;
}

std::string human(std::size_t bytes) {
  char buf[32];
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
    std::snprintf(buf, sizeof buf, "%zuMiB", bytes >> 20);
  else if (bytes >= 1024 && bytes % 1024 == 0)
    std::snprintf(buf, sizeof buf, "%zuKiB", bytes >> 10);
  else
    std::snprintf(buf, sizeof buf, "%zuB", bytes);
  return buf;
}

// Prints the rows of one size; returns the total of the #wrong column.
long run_size(std::size_t bytes, const Options& o) {
  Data d(std::max<std::size_t>(1, bytes / 4), o.density);
  std::vector<Kernel> ks;
  for (auto& k : kernels(d, o.density))
    if (selected(k.name, o.only)) ks.push_back(std::move(k));
  std::vector<long> wrong(ks.size(), -1);
  if (o.check)
    for (std::size_t j = 0; j < ks.size(); ++j) {
      ks[j].reset();
      ks[j].run(KernelImpl::kScalar);
      const auto ref = ks[j].output();
      ks[j].reset();
      ks[j].run(o.impl);
      const auto got = ks[j].output();
      wrong[j] = 0;
      for (std::size_t b = 0; b < std::min(ref.size(), got.size()); ++b) wrong[j] += ref[b] != got[b];
      wrong[j] += static_cast<long>(std::max(ref.size(), got.size()) - std::min(ref.size(), got.size()));
    }
  // Repeat small calls so that one timed sample lasts ~200 us (memcpy at ~30 GB/s).
  const int inner = static_cast<int>(std::max<std::size_t>(1, (std::size_t(6) << 20) / (d.n * 4)));
  std::vector<std::vector<double>> t(ks.size());
  for (auto& k : ks) k.run(o.impl);  // warm-up: page faults, caches
  auto timed = [&o](Kernel& k, int calls) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) k.run(o.impl);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int r = 0; r < o.rounds; ++r)
    for (std::size_t j = 0; j < ks.size(); ++j) {
      double sec = 0;
      if (ks[j].reset_each_call) {
        for (int i = 0; i < inner; ++i) {
          ks[j].reset();
          sec += timed(ks[j], 1);
        }
      } else {
        sec = timed(ks[j], inner);
      }
      t[j].push_back(sec / inner);
      ks[j].reset();
    }
  double memcpy_gbs = 0;
  for (std::size_t j = 0; j < ks.size(); ++j) {
    std::sort(t[j].begin(), t[j].end());
    const double sec = t[j][t[j].size() / 2];
    const double gbs = double(d.n) * 4 / sec / 1e9;
    if (j == 0) memcpy_gbs = gbs;
    char w[24] = "-";
    if (wrong[j] >= 0) std::snprintf(w, sizeof w, "%ld", wrong[j]);
    std::printf("%8s  %-44s %11.2f %8.2f %8.2fx %7s\n", human(d.n * 4).c_str(), ks[j].name.c_str(), sec * 1e6,
                gbs, gbs / memcpy_gbs, w);
  }
  std::fflush(stdout);
  long total = 0;
  for (long w : wrong) total += std::max(0L, w);
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  SimdLevel level;
  try {
    o = parse(argc, argv);
    level = kernel_table(o.impl).level;  // an ISA this CPU lacks: an error here, not mid-run
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zcoll_kernels_perf: %s\n", e.what());
    return 2;
  }
  std::printf("# zcoll_kernels_perf: 1 thread, kernels %s (detected %s), median of %d rounds\n",
              simd_level_name(level), simd_level_name(detected_simd_level()), o.rounds);
  std::printf(
      "# GB/s of float32 input (GB = 1e9 B); x memcpy: ratio to memcpy of the same buffer in this run;\n"
      "# #wrong: output bytes differing from the scalar reference (expected 0)\n");
  std::printf("%8s  %-44s %11s %8s %9s %7s\n", "size", "kernel", "time_us", "GB/s", "x memcpy", "#wrong");
  long wrong = 0;
  for (std::size_t bytes : o.sizes) wrong += run_size(bytes, o);
  if (wrong != 0)
    std::fprintf(stderr, "zcoll_kernels_perf: %ld output bytes differ from the scalar reference\n", wrong);
  return wrong != 0 ? 1 : 0;
}
