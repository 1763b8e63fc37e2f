// Shared harness of the zcoll_*_perf binaries, in the manner of nccl-tests' common.cu: flag
// parsing, buffers, timing (median over iterations of the max over ranks), bandwidth columns,
// the correctness check (#wrong, summed over ranks) and the side-by-side MPI reference.
// Each collective is a small file that fills in a CollectiveBench.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "common/dtype.h"

namespace zcoll::bench {

// How far a lossy variant's result is from the exact one, on one rank.
struct Accuracy {
  long long wrong = 0;  // elements outside the variant's documented error bound (or not finite)
  double max_abs = 0;   // max |result - exact|
  double max_ref = 0;   // max |exact| (relative error = max_abs / max_ref)
};

struct Buffers {
  void* in;
  void* out;
};

struct CollectiveBench {
  const char* name;            // "allreduce"
  bool reduces;                // has an op column
  bool rooted;                 // has a root column
  std::vector<std::string> algorithms;  // zcoll algorithms, "mpi" is added by the harness
  // busbw = algbw * bus_factor(p) (nccl-tests' definitions; see docs/algorithms.md)
  double (*bus_factor)(int p);
  // Elements per rank in `in` and `out` for a row whose size column is `count` elements.
  std::size_t (*in_count)(std::size_t count, int p);
  std::size_t (*out_count)(std::size_t count, int p);
  // Elements actually moved for a requested count (e.g. rounded to a multiple of p).
  std::size_t (*round_count)(std::size_t count, int p);
  // Run once. algorithm is one of `algorithms` or "mpi".
  void (*run)(MpiCommunicator& comm, const std::string& algorithm, Buffers b, std::size_t count,
              DType dtype, ReduceOp op, int root, bool in_place);
  // Value rank `rank` puts at element i of its input, and the expected output element j on
  // rank `rank` (computed with the scalar reference kernels). Chosen so that every reduction
  // order gives the same bits.
  void (*fill_input)(void* in, std::size_t n, DType dtype, ReduceOp op, int rank, int p, int root);
  void (*fill_expected)(void* expected, std::size_t count, DType dtype, ReduceOp op, int rank, int p,
                        int root);
  // Optional, for -z (lossy variants, e.g. compressed allreduce; rows named by the variant,
  // run by `run` on the input fill_gradient writes): check_variant throws
  // std::invalid_argument for a name it does not know or a dtype / op it cannot do; accuracy
  // compares this rank's result with the exact one (from gradient_value, in double).
  void (*check_variant)(const std::string& name, DType dtype, ReduceOp op) = nullptr;
  Accuracy (*accuracy)(const std::string& variant, const void* result, std::size_t count, DType dtype, ReduceOp op,
                       int p) = nullptr;
  // Optional: false for an algorithm this communicator cannot run (shm across nodes, ...); "-a all"
  // leaves those out (naming one explicitly still fails with the algorithm's own message).
  bool (*available)(MpiCommunicator& comm, const std::string& algorithm) = nullptr;
};

// Parses flags, runs the sweep, prints the table; returns the process exit status.
int run_benchmark(int argc, char** argv, const CollectiveBench& bench);

// Input element i of rank r as a double (small integers, or powers of two for prod), and the
// helpers the collective files use to build expectations.
double input_value(std::size_t i, int rank, ReduceOp op);
void store_value(void* buf, std::size_t i, double v, DType dtype);
double load_value(const void* buf, std::size_t i, DType dtype);
// The input of lossy variants: gradient-like values (triangular in (-s, s), s from 1 to 8
// changing every 4096 elements, every magnitude distinct), and that value as stored in dtype.
double gradient_value(std::size_t i, int rank);
double stored_gradient_value(std::size_t i, int rank, DType dtype);
void fill_gradient(void* in, std::size_t n, DType dtype, int rank);
// expected[i] for a reduction over all p ranks of element index `src_index`.
void reduce_expected(void* dst, std::size_t dst_index, std::size_t src_index, DType dtype, ReduceOp op, int p);

}  // namespace zcoll::bench
