// zcoll_allreduce_perf: every allreduce algorithm against MPI_Allreduce (busbw factor 2(p-1)/p).
#include "collectives/options.h"
#include "harness.h"

namespace {
using namespace zcoll;

void run(MpiCommunicator& comm, const std::string& algo, bench::Buffers b, std::size_t count, DType dtype,
         ReduceOp op, int, bool in_place) {
  AllreduceOptions o;
  o.op = op;
  o.algorithm = parse_algorithm(algo);
  allreduce(comm, b.in, in_place ? b.in : b.out, count, dtype, o);
}

void fill_input(void* in, std::size_t n, DType dtype, ReduceOp op, int rank, int, int) {
  for (std::size_t i = 0; i < n; ++i) bench::store_value(in, i, bench::input_value(i, rank, op), dtype);
}

void fill_expected(void* e, std::size_t count, DType dtype, ReduceOp op, int, int p, int) {
  for (std::size_t i = 0; i < count; ++i) bench::reduce_expected(e, i, i, dtype, op, p);
}

std::size_t same(std::size_t count, int) { return count; }
}  // namespace

int main(int argc, char** argv) {
  const bench::CollectiveBench b{
      "allreduce", true, false, {"ring", "tree", "recursive_doubling", "halving_doubling", "shm", "auto"},
      [](int p) { return 2.0 * (p - 1) / p; }, same, same, same, run, fill_input, fill_expected};
  return bench::run_benchmark(argc, argv, b);
}
