#include "comm/communicator.h"

#include <stdexcept>

namespace zcoll {

void Communicator::sendrecv(const void* send_buf, std::size_t send_bytes, int dst, void* recv_buf,
                            std::size_t recv_bytes, int src, int tag) {
  Request r = irecv(recv_buf, recv_bytes, src, tag);
  Request s = isend(send_buf, send_bytes, dst, tag);
  wait(r);
  wait(s);
}

void Communicator::native_allreduce(const void*, void*, std::size_t, DType, ReduceOp) {
  throw std::invalid_argument("algorithm 'mpi' needs an MPI communicator");
}

void* Communicator::scratch(std::size_t bytes, int slot) {
  if (scratch_.size() <= static_cast<std::size_t>(slot)) scratch_.resize(slot + 1);
  auto& buf = scratch_[slot];
  if (buf.size() < bytes) {
    buf.clear();
    buf.shrink_to_fit();
    buf.resize(bytes);
  }
  return buf.data();
}

}  // namespace zcoll
