// zcoll_reduce_scatter_perf: ring reduce-scatter against MPI_Reduce_scatter_block
// (size = the whole input, a multiple of p elements; busbw factor (p-1)/p).
#include <climits>
#include <cstring>
#include <stdexcept>

#include "collectives/options.h"
#include "kernels/reduce.h"
#include "harness.h"

namespace {
using namespace zcoll;

// In place (-i) follows MPI_IN_PLACE: the input is the whole buffer and the result lands at its
// start. zcoll reduces into this rank's own block of the input (exact aliasing), then moves it.
void run(MpiCommunicator& comm, const std::string& algo, bench::Buffers b, std::size_t count, DType dtype,
         ReduceOp op, int, bool in_place) {
  const int p = comm.size();
  const std::size_t block_bytes = count / p * dtype_size(dtype);
  if (algo == "mpi") {
    void* result = in_place ? b.in : b.out;
    MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : b.in, result, static_cast<int>(count / p),
                             mpi_datatype(dtype), mpi_op(dtype, op), comm.comm());
    if (op == ReduceOp::kAvg) kernels::divide(result, count / p, dtype, p);
    return;
  }
  ReduceOptions o;
  o.op = op;
  if (!in_place) return reduce_scatter(comm, b.in, b.out, count, dtype, o);
  auto* buf = static_cast<unsigned char*>(b.in);
  const std::size_t mine = static_cast<std::size_t>(comm.rank()) * block_bytes;
  reduce_scatter(comm, buf, buf + mine, count, dtype, o);
  if (mine) std::memmove(buf, buf + mine, block_bytes);
}

void fill_input(void* in, std::size_t n, DType dtype, ReduceOp op, int rank, int, int) {
  for (std::size_t i = 0; i < n; ++i) bench::store_value(in, i, bench::input_value(i, rank, op), dtype);
}

void fill_expected(void* e, std::size_t count, DType dtype, ReduceOp op, int rank, int p, int) {
  const std::size_t begin = block_begin(count, p, rank);
  for (std::size_t i = 0; i < block_count(count, p, rank); ++i) bench::reduce_expected(e, i, begin + i, dtype, op, p);
}
}  // namespace

int main(int argc, char** argv) {
  const bench::CollectiveBench b{
      "reduce_scatter", true, false, {"ring"}, [](int p) { return double(p - 1) / p; },
      [](std::size_t count, int) { return count; }, [](std::size_t count, int p) { return count / p; },
      [](std::size_t count, int p) { return std::max<std::size_t>(count / p, 1) * p; }, run, fill_input,
      fill_expected};
  return bench::run_benchmark(argc, argv, b);
}
