#include "comm/communicator.h"

#include <stdexcept>

namespace zcoll {

void Communicator::native_allreduce(const void*, void*, std::size_t, DType, ReduceOp) {
  throw std::invalid_argument("algorithm 'mpi' needs an MPI communicator");
}

void* Communicator::scratch(std::size_t bytes, Scratch purpose) {
  auto& buf = scratch_[static_cast<int>(purpose)];
  if (buf.size() < bytes) {
    buf.clear();
    buf.shrink_to_fit();
    buf.resize(bytes);
  }
  return buf.data();
}

}  // namespace zcoll
