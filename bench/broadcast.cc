// zcoll_broadcast_perf: pipelined tree broadcast against MPI_Bcast (busbw factor 1).
#include <cstring>

#include "collectives/options.h"
#include "harness.h"

namespace {
using namespace zcoll;

void run(MpiCommunicator& comm, const std::string& algo, bench::Buffers b, std::size_t count, DType dtype,
         ReduceOp, int root, bool in_place) {
  void* buf = in_place ? b.in : b.out;
  if (!in_place && comm.rank() == root) std::memcpy(b.out, b.in, count * dtype_size(dtype));
  if (algo == "mpi") {
    MPI_Bcast(buf, static_cast<int>(count * dtype_size(dtype)), MPI_BYTE, root, comm.comm());
    return;
  }
  CollectiveOptions o;
  o.root = root;
  broadcast(comm, buf, count, dtype, o);
}

void fill_input(void* in, std::size_t n, DType dtype, ReduceOp op, int rank, int, int root) {
  for (std::size_t i = 0; i < n; ++i)
    bench::store_value(in, i, rank == root ? bench::input_value(i, root, op) : -1.0, dtype);
}

void fill_expected(void* e, std::size_t count, DType dtype, ReduceOp op, int, int, int root) {
  for (std::size_t i = 0; i < count; ++i) bench::store_value(e, i, bench::input_value(i, root, op), dtype);
}

std::size_t same(std::size_t count, int) { return count; }
}  // namespace

int main(int argc, char** argv) {
  const bench::CollectiveBench b{"broadcast", false, true, {"tree"}, [](int) { return 1.0; },
                                 same, same, same, run, fill_input, fill_expected};
  return bench::run_benchmark(argc, argv, b);
}
