// zcoll_allreduce_perf: every allreduce algorithm against MPI_Allreduce (busbw factor 2(p-1)/p),
// and with -z the compressed allreduce (compression.h), checked against its error bound; a
// variant NAME@hierarchical compresses the hierarchical allreduce's inter-node stage only.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "collectives/algorithm_table.h"
#include "collectives/compression.h"
#include "collectives/options.h"
#include "harness.h"

namespace {
using namespace zcoll;

// The -a names: the algorithm table's (algorithm_table.h), auto last; "mpi" is the harness's
// own MPI_Allreduce row.
std::vector<std::string> algorithms_of_table() {
  std::vector<std::string> names;
  for (int code = 0; code < num_allreduce_algorithms(); ++code) {
    const auto algorithm = static_cast<Algorithm>(code);
    if (algorithm != Algorithm::kAuto && algorithm != Algorithm::kMpi)
      names.push_back(algorithm_name(algorithm));
  }
  names.push_back(algorithm_name(Algorithm::kAuto));
  return names;
}

bool is_algorithm(const std::string& name) { return find_allreduce_algorithm(name) != nullptr; }

// What this placement can run: the descriptor's needs (shm on one node, ordered_ring with links).
bool available(MpiCommunicator& comm, const std::string& algo) {
  const AlgorithmDescriptor* d = find_allreduce_algorithm(algo);
  return d != nullptr && offers_needs(comm, d->needs);
}

// A -z variant: a compression spec, optionally @ the algorithm that carries it ("int8@hierarchical").
CompressionOptions parse_variant(const std::string& name) {
  const auto at = name.find('@');
  CompressionOptions o = parse_compression(name.substr(0, at));
  if (at != std::string::npos) o.algorithm = parse_algorithm(name.substr(at + 1));
  return o;
}

void run(MpiCommunicator& comm, const std::string& algo, bench::Buffers b, std::size_t count, DType dtype,
         ReduceOp op, int, bool in_place) {
  void* out = in_place ? b.in : b.out;
  if (!is_algorithm(algo)) {
    CompressionOptions o = parse_variant(algo);
    o.op = op;
    allreduce_compressed(comm, b.in, out, count, dtype, o);
    return;
  }
  AllreduceOptions o;
  o.op = op;
  o.algorithm = parse_algorithm(algo);
  allreduce(comm, b.in, out, count, dtype, o);
}

void fill_input(void* in, std::size_t n, DType dtype, ReduceOp op, int rank, int, int) {
  for (std::size_t i = 0; i < n; ++i) bench::store_value(in, i, bench::input_value(i, rank, op), dtype);
}

void fill_expected(void* e, std::size_t count, DType dtype, ReduceOp op, int, int p, int) {
  for (std::size_t i = 0; i < count; ++i) bench::reduce_expected(e, i, i, dtype, op, p);
}

std::size_t same(std::size_t count, int) { return count; }

void check_variant(const std::string& name, DType dtype, ReduceOp op) {
  CompressionOptions o = parse_variant(name);
  o.op = op;
  validate(o, dtype, 1);
}

// Checks a result against the exact sum (in double) of every rank's stored input and counts
// elements outside the bound of compression.h, with A and M computed from those inputs.
bench::Accuracy accuracy(const std::string& variant, const void* result, std::size_t n, DType dtype,
                         ReduceOp op, int p) {
  const CompressionOptions o = parse_variant(variant);
  std::vector<double> exact(n, 0.0), M(n, 0.0), A;
  for (int r = 0; r < p; ++r)
    for (std::size_t i = 0; i < n; ++i) {
      const double v = bench::stored_gradient_value(i, r, dtype);
      exact[i] += v;
      M[i] += std::fabs(v);
    }
  if (o.kind == Compression::kQuantize) {  // A per block: sum over ranks of the block's max |x|
    A.assign(n, 0.0);
    for (int r = 0; r < p; ++r)
      for (std::size_t b = 0; b < n; b += o.block) {
        const std::size_t e = std::min(n, b + o.block);
        double m = 0;
        for (std::size_t i = b; i < e; ++i)
          m = std::max(m, std::fabs(bench::stored_gradient_value(i, r, dtype)));
        for (std::size_t i = b; i < e; ++i) A[i] += m;
      }
  } else if (o.kind == Compression::kTopK) {  // per segment: sum over ranks of its k_j-th largest |x|
    A.assign(n, 0.0);
    const std::size_t s = topk_segments(n, o.exact_topk);
    for (std::size_t j = 0; j < s; ++j) {
      const std::size_t b = n * j / s, e = n * (j + 1) / s, k = sparse_k(e - b, o.ratio);
      std::vector<double> v(e - b);
      double t = 0;
      for (int r = 0; r < p; ++r) {
        for (std::size_t i = b; i < e; ++i) v[i - b] = std::fabs(bench::stored_gradient_value(i, r, dtype));
        std::nth_element(v.begin(), v.begin() + (k - 1), v.end(), std::greater<double>());
        t += v[k - 1];
      }
      std::fill(A.begin() + b, A.begin() + e, t);
    }
  } else if (o.kind == Compression::kThreshold) {
    A.assign(n, p * static_cast<double>(o.threshold));
  } else {  // half precision, random-k: per element
    A = M;
  }
  // The result is rounded to the output dtype once more at the end.
  const double u_out = dtype == DType::kFloat16    ? std::ldexp(1.0, -11)
                       : dtype == DType::kBFloat16 ? std::ldexp(1.0, -8)
                                                   : std::ldexp(1.0, -24);
  bench::Accuracy acc;
  for (std::size_t i = 0; i < n; ++i) {
    const double want = op == ReduceOp::kAvg ? exact[i] / p : exact[i];
    double bound = compression_error_bound(o, p, A[i], M[i]);
    if (op == ReduceOp::kAvg) bound /= p;
    bound += std::fabs(want) * u_out;
    const double err = std::fabs(bench::load_value(result, i, dtype) - want);
    acc.wrong += !(err <= bound);
    acc.max_abs = std::fmax(acc.max_abs, err);
    acc.max_ref = std::fmax(acc.max_ref, std::fabs(want));
  }
  return acc;
}

}  // namespace

int main(int argc, char** argv) {
  bench::CollectiveBench b{"allreduce", true, false, algorithms_of_table(),
                           [](int p) { return 2.0 * (p - 1) / p; },
                           same, same, same, run, fill_input, fill_expected};
  b.check_variant = check_variant;
  b.accuracy = accuracy;
  b.available = available;
  return bench::run_benchmark(argc, argv, b);
}
