// Compressed allreduce entry point: validate, short-circuit nothing but count 0, count the
// bytes sent, dispatch on the compression kind (compression.h). Everything that differs by kind
// (name, option checks, the call header's fields, the error bound, the spec's spelling and the
// algorithm that carries the payload) is one row of kKinds below, the only place that branches
// on a Compression (Highway's dispatch-table idiom): a new kind is one row and its functions.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "collectives/algorithms.h"
#include "collectives/call_scope.h"
#include "collectives/compressed.h"
#include "collectives/hierarchy.h"
#include "common/check.h"
#include "common/half.h"
#include "kernels/quantize.h"

namespace zcoll {
namespace {

kernels::QuantParams quant_params(const CompressionOptions& o) {
  kernels::QuantParams q;
  q.bits = o.bits;
  q.block = o.block;
  q.rounding = o.stochastic ? kernels::Rounding::kStochastic : kernels::Rounding::kNearest;
  return q;
}

void measure(const float* e, std::size_t n, CompressionStats& stats) {
  double max_abs = 0.0, sq = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = e[i];
    max_abs = std::fmax(max_abs, std::fabs(v));
    sq += v * v;
  }
  stats.error_max_abs = max_abs;
  stats.error_l2 = std::sqrt(sq);
}

template <typename T>
double squares_of_runs(const T* x, std::size_t count, std::size_t sample) {
  const std::size_t runs = count <= sample ? 1 : std::min(kSampleRuns, sample);
  const std::size_t length = count <= sample ? count : sample / runs;
  const std::size_t stride = count / runs;  // count > sample >= runs * length: runs never overlap
  constexpr std::size_t kLanes = 8;  // independent sums: one chain of dependent adds took ~10 us
  double sq[kLanes] = {};
  for (std::size_t j = 0; j < runs; ++j) {
    const T* run = x + j * stride;
    std::size_t i = 0;
    for (; i + kLanes <= length; i += kLanes) {
      for (std::size_t k = 0; k < kLanes; ++k) {
        const double v = to_float(run[i + k]);
        sq[k] += v * v;
      }
    }
    for (; i < length; ++i) {
      const double v = to_float(run[i]);
      sq[0] += v * v;
    }
  }
  double total = 0.0;
  for (double s : sq) total += s;
  return total;
}

double parse_number(const std::string& spec, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  ZCOLL_REQUIRE(!text.empty() && *end == '\0', "bad number '", text, "' in compression '", spec, "'");
  return v;
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// ---- per-kind functions (rows of kKinds) ----------------------------------------------------

void validate_nothing(const CompressionOptions&, std::size_t) {}
void validate_quantize(const CompressionOptions& o, std::size_t) { kernels::validate(quant_params(o)); }

void require_indexable(std::size_t count) {
  ZCOLL_REQUIRE(count < (std::size_t(1) << 32), "sparse compression indexes with uint32: ", count,
                " elements are too many (split the tensor)");
}
void validate_ratio(const CompressionOptions& o, std::size_t count) {
  ZCOLL_REQUIRE(o.ratio > 0.0 && o.ratio <= 1.0, "compression ratio must be in (0, 1], not ", o.ratio);
  require_indexable(count);
}
void validate_threshold(const CompressionOptions& o, std::size_t count) {
  ZCOLL_REQUIRE(o.threshold >= 0.0f && !std::isinf(o.threshold),
                "threshold value must be a finite number >= 0, not ", o.threshold);
  require_indexable(count);
}

void header_nothing(const CompressionOptions&, detail::CallHeader&) {}
void header_quantize(const CompressionOptions& o, detail::CallHeader& h) {
  h.bits = o.bits;
  h.block = static_cast<long long>(o.block);
}
void header_ratio(const CompressionOptions& o, detail::CallHeader& h) {
  std::memcpy(&h.ratio_bits, &o.ratio, sizeof o.ratio);
}
void header_topk(const CompressionOptions& o, detail::CallHeader& h) {
  header_ratio(o, h);
  h.exact_topk = o.exact_topk;  // one segment instead of several
}

double bound_none(const CompressionOptions&, int, double, double) { return 0.0; }
double bound_quantize(const CompressionOptions& o, int p, double A, double M) {
  const double q = o.bits == 8 ? 127.0 : 7.0;
  const double c = o.bits == 1 ? 1.0 : (o.stochastic ? 1.0 : 0.5) / q;
  return p * A * c + p * M * std::ldexp(1.0, -20) + std::ldexp(static_cast<double>(p), -149);
}
double bound_fp16(const CompressionOptions&, int p, double A, double M) {
  const double u = std::ldexp(1.0, -11);
  return A * (std::pow(1.0 + u, p) - 1.0) + p * M * std::ldexp(1.0, -20) +
         std::ldexp(static_cast<double>(p), -25);
}
double bound_bf16(const CompressionOptions&, int p, double A, double M) {
  const double u = std::ldexp(1.0, -8);
  return A * (std::pow(1.0 + u, p) - 1.0) + p * M * std::ldexp(1.0, -20);
}
double bound_sparse(const CompressionOptions&, int p, double A, double M) {
  return A + p * M * std::ldexp(1.0, -23);
}

std::string spec_none(const CompressionOptions&) { return "none"; }
std::string spec_fp16(const CompressionOptions&) { return "fp16"; }
std::string spec_bf16(const CompressionOptions&) { return "bf16"; }
std::string spec_quantize(const CompressionOptions& o) {
  std::string n = o.bits == 1 ? "sign" : o.bits == 8 ? "int8" : "int4";
  if (o.stochastic) n += "s";
  if (o.block != 256) n += ":" + std::to_string(o.block);
  return n;
}
std::string spec_topk(const CompressionOptions& o) {
  return (o.exact_topk ? "topk_exact:" : "topk:") + number_text(o.ratio);
}
std::string spec_randomk(const CompressionOptions& o) { return "randomk:" + number_text(o.ratio); }
std::string spec_threshold(const CompressionOptions& o) { return "threshold:" + number_text(o.threshold); }

// The compressed ring's codecs on the hierarchical allreduce: asked for, or `auto` on ranks that
// span several nodes of the same size (> 1 each), where only the inter-node stage then crosses
// nodes, compressed, and the node-local stages stay exact (docs/algorithms.md).
bool hierarchical_codec(const Communicator& comm, const CompressionOptions& o) {
  if (o.algorithm == Algorithm::kHierarchical) return true;
  return o.algorithm == Algorithm::kAuto && comm.node_count() > 1 && comm.ranks_per_node() > 1;
}

using Run = void (*)(Communicator&, const void* in, void* out, std::size_t count, DType,
                     const CompressionOptions&, float* residual, CompressionStats&);

void run_ring(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
              const CompressionOptions& o, float* e, CompressionStats& stats) {
  stats.nonfinite = hierarchical_codec(comm, o)
                        ? detail::allreduce_hierarchical_compressed(comm, in, out, count, dtype, o, e)
                        : detail::allreduce_compressed_ring(comm, in, out, count, dtype, o, e);
}

// Everything that differs by compression kind, indexed by its code.
struct KindRow {
  Compression kind;
  const char* name;  // Python's Compression names, check mode's messages, the flight recorder
  bool ring_codec;   // carried by the compressed ring's codecs (codecs.cc), so also hierarchical
  void (*validate)(const CompressionOptions&, std::size_t count);         // the kind's own options
  void (*header)(const CompressionOptions&, detail::CallHeader&);         // the fields that shape payloads
  double (*bound)(const CompressionOptions&, int p, double A, double M);  // compression_error_bound
  std::string (*spec)(const CompressionOptions&);                         // compression_name
  Run run;  // the algorithm (kNone: nullptr, the uncompressed allreduce() runs)
};

constexpr KindRow kKinds[] = {
    {Compression::kNone, "none", false, validate_nothing, header_nothing, bound_none, spec_none, nullptr},
    {Compression::kFp16, "fp16", true, validate_nothing, header_nothing, bound_fp16, spec_fp16, run_ring},
    {Compression::kBf16, "bf16", true, validate_nothing, header_nothing, bound_bf16, spec_bf16, run_ring},
    {Compression::kQuantize, "quantize", true, validate_quantize, header_quantize, bound_quantize,
     spec_quantize, run_ring},
    {Compression::kTopK, "topk", false, validate_ratio, header_topk, bound_sparse, spec_topk,
     detail::allreduce_topk},
    {Compression::kRandomK, "randomk", false, validate_ratio, header_ratio, bound_sparse, spec_randomk,
     detail::allreduce_sparse},
    {Compression::kThreshold, "threshold", false, validate_threshold, header_nothing, bound_sparse,
     spec_threshold, detail::allreduce_sparse},
};
static_assert(std::size(kKinds) == kNumCompressions, "one row per Compression kind");

constexpr bool rows_in_code_order() {
  for (int i = 0; i < kNumCompressions; ++i)
    if (static_cast<int>(kKinds[i].kind) != i) return false;
  return true;
}
static_assert(rows_in_code_order(), "kKinds is indexed by the Compression code");

// The kind's row, or nullptr for a code that names no kind.
const KindRow* find_row(Compression kind) {
  const int i = static_cast<int>(kind);
  return i >= 0 && i < kNumCompressions ? &kKinds[i] : nullptr;
}

const KindRow& row(Compression kind) {
  const KindRow* r = find_row(kind);
  if (!r) throw std::invalid_argument(detail::concat("unknown compression kind ", static_cast<int>(kind)));
  return *r;
}

// What shapes the payloads: ranks that differ in any of it would send mismatched messages.
detail::CallHeader call_header(const CompressionOptions& o, DType dtype, std::size_t count) {
  detail::CallHeader h;
  h.collective = detail::Collective::kAllreduceCompressed;
  h.dtype = static_cast<long long>(dtype);
  h.op = static_cast<long long>(o.op);
  h.count = static_cast<long long>(count);
  h.compression = static_cast<long long>(o.kind);
  h.algorithm = static_cast<long long>(o.algorithm);  // auto, or hierarchical (other messages)
  row(o.kind).header(o, h);
  return h;
}

}  // namespace

const char* compression_kind_name(Compression kind) { return row(kind).name; }

Compression parse_compression_kind(const std::string& name) {
  for (const KindRow& r : kKinds)
    if (name == r.name) return r.kind;
  throw std::invalid_argument("unknown compression kind '" + name +
                              "'; valid: none fp16 bf16 quantize topk randomk threshold");
}

namespace detail {
bool compressed_by_ring(Compression kind) { return row(kind).ring_codec; }
}  // namespace detail

std::size_t sparse_k(std::size_t count, double ratio) {
  const auto k = static_cast<std::size_t>(std::llround(ratio * static_cast<double>(count)));
  return std::min(count, std::max<std::size_t>(1, k));
}

std::size_t topk_segments(std::size_t count, bool exact) {
  if (exact) return 1;
  const std::size_t most = std::max<std::size_t>(8, count >> 20);  // 8, or segments of ~4 MiB
  return std::clamp<std::size_t>(count >> 14, 1, most);            // each at least 64 KiB
}

void validate(const CompressionOptions& o, DType dtype, std::size_t count) {
  ZCOLL_REQUIRE(dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16,
                "compressed allreduce needs float32, float16 or bfloat16 data, not ", dtype_name(dtype));
  ZCOLL_REQUIRE(o.op == ReduceOp::kSum || o.op == ReduceOp::kAvg,
                "compressed allreduce supports op 'sum' and 'avg', not '", op_name(o.op),
                "' (compressed values can only be added: sum and avg)");
  const KindRow* r = find_row(o.kind);
  ZCOLL_REQUIRE(
      o.kind == Compression::kNone || o.algorithm == Algorithm::kAuto ||
          (o.algorithm == Algorithm::kHierarchical && r && r->ring_codec),
      "algorithm='", algorithm_name(o.algorithm),
      "' with compression: the compressor picks its own algorithm ",
      "(compressed ring or sparse allgather); leave algorithm='auto' (or 'hierarchical' with fp16, bf16 ",
      "or a quantizer: compression on the inter-node stage only)");
  row(o.kind).validate(o, count);
}

void allreduce_compressed(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                          const CompressionOptions& o, CompressionStats* stats_out) {
  validate(o, dtype, count);
  ZCOLL_REQUIRE(count == 0 || (in != nullptr && out != nullptr), "allreduce_compressed: null buffer");
  ZCOLL_REQUIRE(o.algorithm != Algorithm::kHierarchical || comm.ranks_per_node() > 0,
                "algorithm 'hierarchical' needs the same number of ranks on every node, not ", detail::node_sizes(comm),
                "; leave algorithm='auto' for the compressed ring");
  const KindRow& kind = row(o.kind);
  const bool none = o.kind == Compression::kNone;
  // The recorder names the compression (a literal: records keep the pointer); "" for none.
  const detail::CallScope scope(comm, {none ? "allreduce" : "allreduce_compressed", count, dtype,
                                       none ? "" : kind.name, op_name(o.op)});
  if (!none) detail::check_same_call(comm, call_header(o, dtype, count), o.check_args);
  CompressionStats stats;
  const int p = comm.size();
  const std::uint64_t sent_before = comm.stats().bytes_sent;
  stats.dense_bytes = 2 * static_cast<std::uint64_t>(p - 1) * count * dtype_size(dtype) / p;
  if (none) {
    AllreduceOptions a;
    a.op = o.op;
    a.algorithm = o.algorithm;
    a.pipeline = o.pipeline;
    a.check_args = o.check_args;
    allreduce(comm, in, out, count, dtype, a);
  } else if (count > 0) {
    comm.stats().collectives += 1;
    // the input's before the call overwrites it (in == out), the residual's after
    if (o.norm_sample > 0) stats.input_squares = sampled_squares(in, count, dtype, o.norm_sample);
    float* e = o.residual;
    if (!e && o.measure_error) {
      e = static_cast<float*>(comm.scratch(count * sizeof(float), Scratch::kResidual));
      std::memset(e, 0, count * sizeof(float));
    }
    kind.run(comm, in, out, count, dtype, o, e, stats);
    if (o.measure_error) measure(e, count, stats);
    if (o.norm_sample > 0 && o.residual) {
      stats.residual_squares = sampled_squares(o.residual, count, DType::kFloat32, o.norm_sample);
    }
  }
  stats.wire_bytes = comm.stats().bytes_sent - sent_before;
  if (stats_out) *stats_out = stats;
}

double sampled_squares(const void* x, std::size_t count, DType dtype, std::size_t sample) {
  ZCOLL_REQUIRE(sample > 0, "sampled_squares: sample must be >= 1");
  switch (dtype) {
    case DType::kFloat32: return squares_of_runs(static_cast<const float*>(x), count, sample);
    case DType::kFloat16: return squares_of_runs(static_cast<const float16_t*>(x), count, sample);
    case DType::kBFloat16: return squares_of_runs(static_cast<const bfloat16_t*>(x), count, sample);
    default:
      throw std::invalid_argument(
          detail::concat("sampled_squares: float32, float16 or bfloat16, not ", dtype_name(dtype)));
  }
}

double compression_error_bound(const CompressionOptions& o, int p, double A, double M) {
  const KindRow* r = find_row(o.kind);
  return r ? r->bound(o, p, A, M) : 0.0;
}

CompressionOptions parse_compression(const std::string& spec) {
  CompressionOptions o;
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  auto number = [&](double fallback) { return arg.empty() ? fallback : parse_number(spec, arg); };
  if (name == "none") {
    o.kind = Compression::kNone;
  } else if (name == "fp16" || name == "bf16") {
    o.kind = name == "fp16" ? Compression::kFp16 : Compression::kBf16;
  } else if (name == "int8" || name == "int4" || name == "sign" || name == "int8s" || name == "int4s") {
    o.kind = Compression::kQuantize;
    o.bits = name == "sign" ? 1 : name[3] == '8' ? 8 : 4;
    o.stochastic = name.size() == 5;
    o.block = static_cast<std::size_t>(number(256));
  } else if (name == "topk" || name == "topk_exact" || name == "randomk") {
    o.kind = name == "randomk" ? Compression::kRandomK : Compression::kTopK;
    o.exact_topk = name == "topk_exact";
    o.ratio = number(0.01);
  } else if (name == "threshold") {
    o.kind = Compression::kThreshold;
    o.threshold = static_cast<float>(number(0.0));
    ZCOLL_REQUIRE(!arg.empty(), "threshold needs a value: threshold:T");
  } else {
    throw std::invalid_argument("unknown compression '" + spec +
                                "'; valid: none fp16 bf16 int8[:block] int4[:block] sign[:block] int8s int4s "
                                "topk:RATIO topk_exact:RATIO randomk:RATIO threshold:T");
  }
  return o;
}

std::string compression_name(const CompressionOptions& o) {
  const KindRow* r = find_row(o.kind);
  return r ? r->spec(o) : "?";
}

}  // namespace zcoll
