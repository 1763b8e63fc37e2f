// The compressed allreduce (collectives/compression.h) on 1..8 thread-ranks: every kind within
// the documented error bound (compression_error_bound, with A and M computed here from every
// rank's input) and bitwise identical on every rank; top-k equal to a plain-loop reference
// (per-segment top-k of every rank, added in rank order) bit for bit; error feedback's
// invariant; non-finite inputs reported on every rank.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "collectives/compression.h"
#include "reference.h"
#include "ztest.h"

using ref::Buffer;
using zcoll::Communicator;
using zcoll::CompressionOptions;
using zcoll::CompressionStats;
using zcoll::DType;
using zcoll::ReduceOp;

namespace {

constexpr int kMaxRanks = 8;

struct Spec {
  const char* name;  // parse_compression's spelling
  bool half_dtypes;  // also run float16 and bfloat16 inputs
};
const Spec kSpecs[] = {{"fp16", true},          {"bf16", true},
                       {"int8", true},          {"int4", false},
                       {"sign", false},         {"int8s", false},
                       {"int4s", false},        {"int4:64", false},
                       {"topk:0.01", true},     {"topk_exact:0.3", false},
                       {"randomk:0.05", false}, {"threshold:1.5", false}};

// Gradient-like input: standard normal times a scale per 64-element block (0.1 .. 8), so blocks
// of a quantizer differ in range; stored in dtype.
Buffer gradient(DType dtype, std::size_t n, int rank, std::uint64_t salt = 0) {
  Buffer x(dtype, n);
  for (std::size_t i = 0; i < n; ++i) {
    const double scale = 0.1 + 7.9 * ref::uniform(rank, i / 64, n, 11 + salt);
    const double u1 = 1.0 - ref::uniform(rank, i, n, 12 + salt), u2 = ref::uniform(rank, i, n, 13 + salt);
    x.set(i, scale * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return x;
}

struct Segments {  // top-k's segment layout (compression.h), from its documented formula
  std::vector<std::size_t> begin, k;
};
Segments topk_layout(std::size_t n, const CompressionOptions& o) {
  Segments s;
  const std::size_t S = zcoll::topk_segments(n, o.exact_topk);
  for (std::size_t j = 0; j <= S; ++j) s.begin.push_back(n * j / S);
  for (std::size_t j = 0; j < S; ++j) s.k.push_back(zcoll::sparse_k(s.begin[j + 1] - s.begin[j], o.ratio));
  return s;
}

// Indices rank x keeps in segment [lo, hi): the k largest |x|, ties to the lower index.
std::vector<std::size_t> top_indices(const Buffer& x, std::size_t lo, std::size_t hi, std::size_t k) {
  std::vector<double> magnitude(hi - lo);
  for (std::size_t i = lo; i < hi; ++i) magnitude[i - lo] = std::fabs(x.get(i));
  std::vector<std::size_t> idx(hi - lo);
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  std::stable_sort(idx.begin(), idx.end(),
                   [&](std::size_t a, std::size_t b) { return magnitude[a] > magnitude[b]; });
  idx.resize(k);
  for (auto& i : idx) i += lo;
  return idx;
}

// The documented per-element bound (compression.h) plus the output dtype's rounding of the
// exact result.
std::vector<double> allowed_error(const CompressionOptions& o, const std::vector<Buffer>& xs,
                                  const std::vector<double>& exact) {
  const std::size_t n = exact.size();
  const int p = static_cast<int>(xs.size());
  std::vector<double> M(n, 0.0), A(n, 0.0), out(n);
  if (n == 0) return out;
  for (const Buffer& x : xs)
    for (std::size_t i = 0; i < n; ++i) M[i] += std::fabs(x.get(i));
  switch (o.kind) {
    case zcoll::Compression::kQuantize:  // A = M = SUM over ranks of max |x| over the block of i
      for (const Buffer& x : xs)
        for (std::size_t b = 0; b < n; b += o.block) {
          double m = 0;
          for (std::size_t i = b; i < std::min(n, b + o.block); ++i) m = std::max(m, std::fabs(x.get(i)));
          for (std::size_t i = b; i < std::min(n, b + o.block); ++i) A[i] += m;
        }
      M = A;
      break;
    case zcoll::Compression::kTopK: {  // A = SUM over ranks of the k_j-th largest |x| of i's segment
      const Segments s = topk_layout(n, o);
      for (const Buffer& x : xs)
        for (std::size_t j = 0; j + 1 < s.begin.size(); ++j) {
          const auto kept = top_indices(x, s.begin[j], s.begin[j + 1], s.k[j]);
          const double kth = std::fabs(x.get(kept.back()));
          for (std::size_t i = s.begin[j]; i < s.begin[j + 1]; ++i) A[i] += kth;
        }
      break;
    }
    case zcoll::Compression::kThreshold:
      std::fill(A.begin(), A.end(), p * static_cast<double>(o.threshold));
      break;
    default:  // fp16, bf16, random-k: A = SUM |x|
      A = M;
  }
  const double u = ref::unit_roundoff(xs[0].dtype);
  for (std::size_t i = 0; i < n; ++i) {
    double b = zcoll::compression_error_bound(o, p, A[i], M[i]);
    if (o.op == ReduceOp::kAvg) b /= p;
    out[i] = b + std::fabs(exact[i]) * u;
  }
  return out;
}

struct Result {
  Buffer out;
  CompressionStats stats;
  bool done = false;
};

std::string case_name(const char* spec, DType dtype, std::size_t n, ReduceOp op, std::size_t segment,
                      bool in_place) {
  return ztest::str(spec, " ", zcoll::dtype_name(dtype), " n=", n, " ", zcoll::op_name(op),
                    " segment=", segment, in_place ? " in-place" : "");
}

struct CCase {
  CompressionOptions options;
  const char* spec;
  DType dtype;
  std::size_t n;
  bool in_place;
};

void run_compressed_cases(int p, const std::vector<CCase>& list,
                          const zcoll::InProcOptions& transport = ztest::test_options()) {
  std::vector<std::vector<Result>> got(list.size(), std::vector<Result>(static_cast<std::size_t>(p)));
  ON_RANKS(p, transport, [&](Communicator& comm) {
    for (std::size_t c = 0; c < list.size(); ++c) {
      const CCase& k = list[c];
      Result& r = got[c][static_cast<std::size_t>(comm.rank())];
      Buffer x = gradient(k.dtype, k.n, comm.rank());
      r.out = Buffer(k.dtype, k.n, 0xEE);
      if (k.in_place) r.out = x;
      zcoll::allreduce_compressed(comm, k.in_place ? r.out.data() : x.data(), r.out.data(), k.n, k.dtype,
                                  k.options, &r.stats);
      r.done = true;
    }
  });
  for (std::size_t c = 0; c < list.size(); ++c) {
    const CCase& k = list[c];
    const auto& results = got[c];
    if (!std::all_of(results.begin(), results.end(), [](const Result& r) { return r.done; })) continue;
    ztest::Context ctx(ztest::str(
        case_name(k.spec, k.dtype, k.n, k.options.op, k.options.pipeline.max_segment_bytes, k.in_place),
        " algorithm ", zcoll::algorithm_name(k.options.algorithm), " p=", p));
    std::vector<Buffer> xs;
    for (int r = 0; r < p; ++r) xs.push_back(gradient(k.dtype, k.n, r));
    std::vector<double> exact(k.n, 0.0);
    for (std::size_t i = 0; i < k.n; ++i) {
      for (const Buffer& x : xs) exact[i] += x.get(i);
      if (k.options.op == ReduceOp::kAvg) exact[i] /= p;
    }
    const std::vector<double> allowed = allowed_error(k.options, xs, exact);
    for (int r = 0; r < p; ++r) {
      ztest::Context rank_ctx(ztest::str("rank ", r));
      const Result& res = results[static_cast<std::size_t>(r)];
      std::size_t bad = 0;
      std::string first;
      for (std::size_t i = 0; i < k.n; ++i) {
        const double err = std::fabs(res.out.get(i) - exact[i]);
        if (!(err <= allowed[i]) && !bad++)
          first = ztest::str("at ", i, ": got ", res.out.get(i), ", exact ", exact[i], ", error ", err, " > ",
                             allowed[i]);
      }
      CHECK_EQ(bad ? ztest::str(bad, " of ", k.n, " elements outside the bound; first ", first) : "", "");
      if (r > 0) CHECK_EQ(ref::compare_bits(res.out, results[0].out), "");
      CHECK_EQ(res.stats.nonfinite, 0u);
      CHECK_EQ(res.stats.wire_bytes > 0, p > 1 && k.n > 0);
      CHECK_EQ(res.stats.pairs, results[0].stats.pairs);
    }
  }
}

}  // namespace

TEST(compressed, within_bound_and_identical) {
  const std::size_t sizes[] = {0, 1, 7, 255, 256, 257, 1000, 4099};
  for (int p = 1; p <= kMaxRanks; ++p) {
    std::vector<CCase> list;
    for (const Spec& spec : kSpecs) {
      std::vector<DType> dtypes = {DType::kFloat32};
      if (spec.half_dtypes) dtypes.insert(dtypes.end(), {DType::kFloat16, DType::kBFloat16});
      for (DType dtype : dtypes)
        for (std::size_t n : sizes) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
            CCase c{zcoll::parse_compression(spec.name), spec.name, dtype, n, n == 1000};
            c.options.op = op;
            list.push_back(c);
          }
          if (n >= 1000) {  // several segments per chunk, and the send stream 1 message ahead
            CCase c{zcoll::parse_compression(spec.name), spec.name, dtype, n, false};
            c.options.pipeline.max_segment_bytes = 1024;
            c.options.pipeline.depth = dtype == DType::kFloat32 ? 1 : 0;
            list.push_back(c);
          }
        }
    }
    run_compressed_cases(p, list);
  }
}

// The ring codecs on the hierarchical allreduce's inter-node stage (algorithm hierarchical, and
// auto on equal nodes of several ranks), on emulated nodes: within the compressed ring's bound
// (each element is quantized once per node sum, N <= p times) and identical on every rank.
TEST(compressed, hierarchical_on_nodes) {
  const std::vector<std::vector<int>> layouts = {{0, 0, 1, 1}, {0, 1, 0, 1}, {0, 0, 0, 1, 1, 1}, {0, 0, 1, 1, 2, 2}};
  const char* specs[] = {"fp16", "bf16", "int8", "int4", "sign", "int8s", "int4:64"};
  for (const std::vector<int>& nodes : layouts) {
    const int p = static_cast<int>(nodes.size());
    std::vector<CCase> list;
    for (const char* spec : specs)
      for (std::size_t n : {std::size_t{1}, std::size_t{257}, std::size_t{1000}, std::size_t{4099}})
        for (zcoll::Algorithm algorithm : {zcoll::Algorithm::kHierarchical, zcoll::Algorithm::kAuto})
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
            CCase c{zcoll::parse_compression(spec), spec, DType::kFloat32, n, n == 1000};
            c.options.op = op;
            c.options.algorithm = algorithm;
            if (n == 4099) c.options.pipeline.max_segment_bytes = 1024;  // several blocks
            list.push_back(c);
          }
    zcoll::InProcOptions transport = ztest::test_options();
    transport.nodes = nodes;
    std::string text;
    for (int node : nodes) text += std::to_string(node);
    ztest::Context ctx(ztest::str("nodes ", text));
    run_compressed_cases(p, list, transport);
  }
}

// Top-k without error feedback equals a plain-loop reference bit for bit: every rank's
// per-segment top-k (ties to the lower index) added in rank order into float32 zeros; above
// count / 2 pairs a dense ring runs instead (float rounding only).
TEST(compressed, topk_matches_reference) {
  struct Shape {
    std::size_t n;
    double ratio;
    std::size_t segment;
  };
  const Shape shapes[] = {{1000, 0.01, 0},    {65537, 0.01, 0}, {65537, 0.01, 4096},
                          {40000, 0.2, 4096}, {300, 0.3, 0},    {50, 1.0, 0}};
  for (int p = 1; p <= kMaxRanks; ++p) {
    std::vector<std::vector<Buffer>> outs(std::size(shapes),
                                          std::vector<Buffer>(static_cast<std::size_t>(p)));
    std::vector<std::vector<CompressionStats>> stats(
        std::size(shapes), std::vector<CompressionStats>(static_cast<std::size_t>(p)));
    ON_RANKS(p, ztest::test_options(), [&](Communicator& comm) {
      for (std::size_t s = 0; s < std::size(shapes); ++s) {
        CompressionOptions o = zcoll::parse_compression(ztest::str("topk:", shapes[s].ratio));
        o.pipeline.max_segment_bytes = shapes[s].segment;
        Buffer x = gradient(DType::kFloat32, shapes[s].n, comm.rank(), 1);
        Buffer& y = outs[s][static_cast<std::size_t>(comm.rank())];
        y = Buffer(DType::kFloat32, shapes[s].n);
        zcoll::allreduce_compressed(comm, x.data(), y.data(), shapes[s].n, DType::kFloat32, o,
                                    &stats[s][static_cast<std::size_t>(comm.rank())]);
      }
    });
    for (std::size_t s = 0; s < std::size(shapes); ++s) {
      const Shape& sh = shapes[s];
      ztest::Context ctx(ztest::str("topk:", sh.ratio, " n=", sh.n, " segment=", sh.segment, " p=", p));
      CompressionOptions o = zcoll::parse_compression(ztest::str("topk:", sh.ratio));
      const Segments layout = topk_layout(sh.n, o);
      const std::size_t K = std::accumulate(layout.k.begin(), layout.k.end(), std::size_t{0});
      std::vector<float> want(sh.n, 0.0f);
      std::vector<double> slack(sh.n, 0.0);
      for (int r = 0; r < p; ++r) {
        const Buffer x = gradient(DType::kFloat32, sh.n, r, 1);
        for (std::size_t i = 0; i < sh.n; ++i) slack[i] += p * std::ldexp(std::fabs(x.get(i)), -23);
        for (std::size_t j = 0; j < layout.k.size(); ++j)
          for (std::size_t i : top_indices(x, layout.begin[j], layout.begin[j + 1], layout.k[j]))
            want[i] += static_cast<float>(x.get(i));
      }
      Buffer expected(DType::kFloat32, sh.n);
      for (std::size_t i = 0; i < sh.n; ++i) expected.set(i, want[i]);
      for (int r = 0; r < p; ++r) {
        ztest::Context rank_ctx(ztest::str("rank ", r));
        const CompressionStats& st = stats[s][static_cast<std::size_t>(r)];
        const Buffer& y = outs[s][static_cast<std::size_t>(r)];
        CHECK_EQ(st.pairs, static_cast<std::uint64_t>(p) * K);
        CHECK_EQ(st.dense_fallback, 2 * st.pairs > sh.n);
        if (!st.dense_fallback) {
          CHECK_EQ(ref::compare_bits(y, expected), "");
        } else {
          std::size_t bad = 0;
          for (std::size_t i = 0; i < sh.n; ++i) bad += !(std::fabs(y.get(i) - want[i]) <= slack[i]);
          CHECK_EQ(bad, 0u);
        }
        if (r > 0) CHECK_EQ(ref::compare_bits(y, outs[s][0]), "");
      }
    }
  }
}

// Error feedback: after every step, SUM(results) + SUM over ranks(residual) equals SUM over ranks
// and steps of the inputs (up to float rounding): what is not sent now is owed, not lost.
TEST(compressed, error_feedback_invariant) {
  const char* specs[] = {"int8", "int4", "sign", "topk:0.1", "randomk:0.25", "threshold:2"};
  constexpr std::size_t kN = 3000;
  constexpr int kSteps = 4;
  for (int p : {1, 2, 3, 5, 8}) {
    for (const char* spec : specs) {
      std::vector<std::vector<double>> results(static_cast<std::size_t>(p), std::vector<double>(kN, 0.0));
      std::vector<std::vector<float>> residuals(static_cast<std::size_t>(p), std::vector<float>(kN, 0.0f));
      ON_RANKS(p, ztest::test_options(), [&](Communicator& comm) {
        const auto me = static_cast<std::size_t>(comm.rank());
        CompressionOptions o = zcoll::parse_compression(spec);
        o.residual = residuals[me].data();
        o.seed = 5;
        Buffer x = gradient(DType::kFloat32, kN, comm.rank(), 2);
        Buffer y(DType::kFloat32, kN);
        for (int step = 0; step < kSteps; ++step) {
          o.seed = 5 + static_cast<std::uint64_t>(step);
          zcoll::allreduce_compressed(comm, x.data(), y.data(), kN, DType::kFloat32, o);
          for (std::size_t i = 0; i < kN; ++i) results[me][i] += y.get(i);
        }
      });
      ztest::Context ctx(ztest::str(spec, " p=", p));
      std::vector<Buffer> xs;
      for (int r = 0; r < p; ++r) xs.push_back(gradient(DType::kFloat32, kN, r, 2));
      double worst = 0, max_abs = 0;
      for (std::size_t i = 0; i < kN; ++i) {
        double inputs = 0, owed = 0;
        for (int r = 0; r < p; ++r) {
          const double xi = xs[static_cast<std::size_t>(r)].get(i);
          inputs += kSteps * xi;
          owed += residuals[static_cast<std::size_t>(r)][i];
          max_abs = std::max(max_abs, std::fabs(xi));
        }
        worst = std::max(worst, std::fabs(results[0][i] + owed - inputs));
      }
      CHECK_LE(worst, 1e-5 * kSteps * p * max_abs * 4);
      for (int r = 1; r < p; ++r) CHECK(results[static_cast<std::size_t>(r)] == results[0]);
    }
  }
}

// A NaN or infinity on one rank is reported in stats.nonfinite on every rank (the same count),
// nobody hangs, and the next call on the same communicator is clean.
TEST(compressed, nonfinite_reported_on_every_rank) {
  const char* specs[] = {"int8",      "int4",      "sign",        "fp16",    "bf16",
                         "topk:0.01", "randomk:1", "threshold:1", "topk:0.6"};
  constexpr std::size_t kN = 40000;
  for (int p : {1, 2, 4, 7}) {
    for (const char* spec : specs) {
      for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
        const int bad_rank = std::isnan(bad) ? p - 1 : 0;
        std::vector<CompressionStats> first(static_cast<std::size_t>(p)), second(static_cast<std::size_t>(p));
        std::vector<Buffer> clean(static_cast<std::size_t>(p));
        ON_RANKS(p, ztest::test_options(), [&](Communicator& comm) {
          const auto me = static_cast<std::size_t>(comm.rank());
          CompressionOptions o = zcoll::parse_compression(spec);
          o.op = ReduceOp::kAvg;
          Buffer x = gradient(DType::kFloat32, kN, comm.rank(), 3);
          if (comm.rank() == bad_rank) x.set(kN / 3, bad);
          Buffer y(DType::kFloat32, kN);
          zcoll::allreduce_compressed(comm, x.data(), y.data(), kN, DType::kFloat32, o, &first[me]);
          x.set(kN / 3, 0.0);
          o.op = ReduceOp::kSum;
          zcoll::allreduce_compressed(comm, x.data(), y.data(), kN, DType::kFloat32, o, &second[me]);
          clean[me] = y;
        });
        ztest::Context ctx(ztest::str(spec, " p=", p, " value ", bad, " on rank ", bad_rank));
        for (int r = 0; r < p; ++r) {
          CHECK_GT(first[static_cast<std::size_t>(r)].nonfinite, 0u);
          CHECK_EQ(first[static_cast<std::size_t>(r)].nonfinite, first[0].nonfinite);
          CHECK_EQ(second[static_cast<std::size_t>(r)].nonfinite, 0u);
          std::size_t nonfinite = 0;
          for (std::size_t i = 0; i < kN; ++i)
            nonfinite += !std::isfinite(clean[static_cast<std::size_t>(r)].get(i));
          CHECK_EQ(nonfinite, 0u);
          if (r > 0) CHECK_EQ(ref::compare_bits(clean[static_cast<std::size_t>(r)], clean[0]), "");
        }
      }
    }
  }
}
