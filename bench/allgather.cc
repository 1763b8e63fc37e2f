// zcoll_allgather_perf: ring allgather against MPI_Allgather (size = the gathered result, a
// multiple of p elements; busbw factor (p-1)/p).
#include "collectives/options.h"
#include "harness.h"

namespace {
using namespace zcoll;

void run(MpiCommunicator& comm, const std::string& algo, bench::Buffers b, std::size_t count, DType dtype,
         ReduceOp, int, bool in_place) {
  const int p = comm.size();
  const std::size_t bytes = count / p * dtype_size(dtype);
  auto* out = static_cast<unsigned char*>(in_place ? b.in : b.out);
  const void* in = in_place ? out + comm.rank() * bytes : b.in;
  if (algo == "mpi") {
    MPI_Allgather(in_place ? MPI_IN_PLACE : in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes),
                  MPI_BYTE, comm.comm());
    return;
  }
  allgather(comm, in, out, count / p, dtype);
}

void fill_input(void* in, std::size_t n, DType dtype, ReduceOp op, int rank, int p, int) {
  // Out-of-place reads the first n/p elements; in-place reads block `rank` of the buffer.
  const std::size_t per = n / p;
  for (std::size_t i = 0; i < n; ++i)
    bench::store_value(in, i, bench::input_value(i % per, i < per ? rank : int(i / per), op), dtype);
  if (p > 1)
    for (std::size_t i = 0; i < per; ++i)
      bench::store_value(in, rank * per + i, bench::input_value(i, rank, op), dtype);
}

void fill_expected(void* e, std::size_t count, DType dtype, ReduceOp op, int, int p, int) {
  const std::size_t per = count / p;
  for (std::size_t i = 0; i < count; ++i) bench::store_value(e, i, bench::input_value(i % per, int(i / per), op), dtype);
}
}  // namespace

int main(int argc, char** argv) {
  const bench::CollectiveBench b{
      "allgather", false, false, {"ring"}, [](int p) { return double(p - 1) / p; },
      [](std::size_t count, int) { return count; }, [](std::size_t count, int) { return count; },
      [](std::size_t count, int p) { return std::max<std::size_t>(count / p, 1) * p; }, run, fill_input,
      fill_expected};
  return bench::run_benchmark(argc, argv, b);
}
