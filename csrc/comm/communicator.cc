#include "comm/communicator.h"

#include <stdexcept>

#include "comm/dump.h"
#include "common/env.h"

namespace zcoll {

Communicator::Communicator()
    : watchdog_(*this),
      recorder_(static_cast<std::size_t>(env::get_int(env::Var::kFlightRecorder))),
      telemetry_(env::get_bool(env::Var::kTelemetry)) {
  watchdog_.on_failure = [this](const std::string& what) { return dump_communicator(*this, what); };
}

// Unregistered first: a dump running on another thread never sees a communicator being torn down.
Communicator::~Communicator() { detail::unregister_for_dumps(this); }

void Communicator::set_identity(const std::string& id, int rank, int size) {
  id_ = id;
  id_rank_ = rank;
  id_size_ = size;
  telemetry_.resize(size);
  detail::register_for_dumps(this);
}

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
