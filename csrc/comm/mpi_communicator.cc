#include "comm/mpi_communicator.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "comm/backoff.h"
#include "common/check.h"
#include "common/env.h"
#include "kernels/reduce.h"

namespace zcoll {
namespace {

static_assert(sizeof(MPI_Request) <= sizeof(std::uint64_t), "MPI_Request must fit a Request handle");

std::uint64_t to_handle(MPI_Request r) {
  std::uint64_t h = 0;
  std::memcpy(&h, &r, sizeof(r));
  return h;
}
MPI_Request from_handle(std::uint64_t h) {
  MPI_Request r;
  std::memcpy(&r, &h, sizeof(r));
  return r;
}

// Cores the node's ranks can share: the online CPUs, capped by this process's affinity mask
// unless the launcher pinned each rank to its own core(s) (Open MPI binds by default), in which
// case the mask says nothing about the node.
int cpus_available(int local_ranks) {
  const int online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return online;
  const int mine = CPU_COUNT(&set);
  return mine * local_ranks <= online ? online : mine;
}

WaitPolicy choose_wait_policy(bool oversubscribed) {
  const std::string& v = env::get_choice(env::Var::kWait);
  if (v == "spin") return WaitPolicy::kSpin;
  if (v == "yield") return WaitPolicy::kYield;
  return oversubscribed ? WaitPolicy::kYield : WaitPolicy::kSpin;
}

// A power of two, so that every chunk but the last stays aligned.
constexpr std::size_t kMaxMpiCount = std::size_t(1) << 30;

int to_int_count(std::size_t bytes) {
  ZCOLL_CHECK_LE(bytes, static_cast<std::size_t>(INT_MAX), "one message must stay below 2 GiB");
  return static_cast<int>(bytes);
}

// User-defined ops that call zcoll's own kernel. MPI has no predefined half-precision types, so
// float16/bfloat16 travel as 2-byte elements reduced by these (same rounding as ours). float32 /
// float64 min and max use them too: MPI_MIN / MPI_MAX drop NaNs (C's a < b ? a : b) where
// zcoll's kernels propagate them, and "auto" hands small messages to MPI, so without this the
// NaN behaviour of auto would depend on the message size.
template <ReduceOp kOp, DType kType>
void kernel_op(void* in, void* inout, int* len, MPI_Datatype*) {
  kernels::reduce(inout, in, inout, static_cast<std::size_t>(*len), kType, kOp);
}

MPI_Datatype half_datatype() {
  static MPI_Datatype type = [] {
    MPI_Datatype t;
    ZCOLL_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t));
    ZCOLL_MPI_CHECK(MPI_Type_commit(&t));
    return t;
  }();
  return type;
}

// The user ops of one dtype, created together on first use. A function-local static is
// initialised exactly once even when two torch groups' worker threads ask at the same time.
template <DType kType>
MPI_Op kernel_mpi_op(ReduceOp op) {
  struct Ops {
    MPI_Op op[4];
    Ops() {
      MPI_User_function* fns[4] = {kernel_op<ReduceOp::kSum, kType>, kernel_op<ReduceOp::kProd, kType>,
                                   kernel_op<ReduceOp::kMin, kType>, kernel_op<ReduceOp::kMax, kType>};
      for (int i = 0; i < 4; ++i) ZCOLL_MPI_CHECK(MPI_Op_create(fns[i], /*commute=*/1, &op[i]));
    }
  };
  static const Ops ops;
  return ops.op[op == ReduceOp::kAvg ? 0 : static_cast<int>(op)];
}

}  // namespace

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kInt8: return MPI_INT8_T;
    case DType::kUInt8: return MPI_UINT8_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kFloat16:
    case DType::kBFloat16: break;
  }
  return half_datatype();
}

MPI_Op mpi_op(DType dtype, ReduceOp op) {
  if (dtype == DType::kFloat16) return kernel_mpi_op<DType::kFloat16>(op);
  if (dtype == DType::kBFloat16) return kernel_mpi_op<DType::kBFloat16>(op);
  if (op == ReduceOp::kMin || op == ReduceOp::kMax) {
    if (dtype == DType::kFloat32) return kernel_mpi_op<DType::kFloat32>(op);
    if (dtype == DType::kFloat64) return kernel_mpi_op<DType::kFloat64>(op);
  }
  switch (op) {
    case ReduceOp::kProd: return MPI_PROD;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kSum:
    case ReduceOp::kAvg: break;
  }
  return MPI_SUM;
}


void mpi_check(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(detail::concat(file, ":", line, ": ", call, " failed: ", std::string(text, len)));
}

MpiCommunicator::MpiCommunicator(MPI_Comm parent) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  ZCOLL_REQUIRE(initialized, "MPI is not initialised: call MPI_Init (or import mpi4py.MPI) first");
  ZCOLL_REQUIRE(parent != MPI_COMM_NULL, "cannot build a communicator from MPI_COMM_NULL");
  ZCOLL_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  ZCOLL_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  ZCOLL_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ZCOLL_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_Comm local;
  ZCOLL_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  ZCOLL_MPI_CHECK(MPI_Comm_size(local, &local_size_));
  ZCOLL_MPI_CHECK(MPI_Comm_free(&local));
  oversubscribed_ = local_size_ > cpus_available(local_size_);
  wait_policy_ = choose_wait_policy(oversubscribed_);
  shm_allowed_ = env::get_bool(env::Var::kShm);
}

// Never calls MPI: freeing a window or a communicator is collective, and destruction order
// (garbage collection in Python) differs between ranks. A communicator not freed by free() is
// left to MPI_Finalize (mpi4py's model; the Python layer warns).
MpiCommunicator::~MpiCommunicator() = default;

void MpiCommunicator::free() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  MPI_Win window = arena_window_;
  MPI_Comm comm = comm_;
  arena_window_ = MPI_WIN_NULL;
  arena_.regions.clear();
  comm_ = MPI_COMM_NULL;
  if (finalized) return;
  if (window != MPI_WIN_NULL) ZCOLL_MPI_CHECK(MPI_Win_free(&window));
  ZCOLL_MPI_CHECK(MPI_Comm_free(&comm));
}

SharedArena* MpiCommunicator::shared_arena() {
  if (!has_shared_arena()) return nullptr;
  if (arena_window_ != MPI_WIN_NULL) return &arena_;
  // One region per rank: the flags, then the algorithms' staging areas. The size is fixed (not
  // per message), so every rank allocates the same window whatever it is asked to reduce.
  const auto data_bytes = static_cast<std::size_t>(env::get_int(env::Var::kShmBytes));
  // +64: MPI only promises 8-byte alignment; each region is rounded up to a cache line below
  // (the offset within a page is the same in every process that maps it).
  const std::size_t bytes = kSharedFlags * sizeof(SharedFlag) + data_bytes + 64;
  MPI_Info info;
  ZCOLL_MPI_CHECK(MPI_Info_create(&info));
  ZCOLL_MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true"));  // each region near its owner
  void* mine = nullptr;
  ZCOLL_MPI_CHECK(MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes), 1, info, comm_, &mine, &arena_window_));
  MPI_Info_free(&info);
  arena_.regions.resize(size_);
  for (int r = 0; r < size_; ++r) {
    MPI_Aint size = 0;
    int disp = 0;
    void* base = nullptr;
    ZCOLL_MPI_CHECK(MPI_Win_shared_query(arena_window_, r, &size, &disp, &base));
    const auto address = reinterpret_cast<std::uintptr_t>(base);
    arena_.regions[r] = reinterpret_cast<unsigned char*>((address + 63) / 64 * 64);
  }
  arena_.region_bytes = data_bytes;
  arena_.yield_when_waiting = wait_policy_ == WaitPolicy::kYield;
  // Zero this rank's flags, then make sure every rank has done so before anyone polls them.
  for (int f = 0; f < kSharedFlags; ++f) new (&arena_.flags(rank_)[f]) SharedFlag();
  ZCOLL_MPI_CHECK(MPI_Barrier(comm_));
  return &arena_;
}

Request MpiCommunicator::isend(const void* buf, std::size_t bytes, int peer, int tag) {
  MPI_Request r;
  ZCOLL_MPI_CHECK(MPI_Isend(buf, to_int_count(bytes), MPI_BYTE, peer, tag, comm_, &r));
  stats_.bytes_sent += bytes;
  stats_.messages_sent += 1;
  return Request{to_handle(r), true};
}

Request MpiCommunicator::irecv(void* buf, std::size_t bytes, int peer, int tag) {
  MPI_Request r;
  ZCOLL_MPI_CHECK(MPI_Irecv(buf, to_int_count(bytes), MPI_BYTE, peer, tag, comm_, &r));
  return Request{to_handle(r), true};
}

void MpiCommunicator::wait(Request& request) {
  if (!request.active) return;
  MPI_Request r = from_handle(request.handle);
  Backoff backoff(wait_policy_ == WaitPolicy::kYield);
  for (int done = 0;;) {
    ZCOLL_MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    if (done) break;
    backoff.pause();
  }
  request.active = false;
}

bool MpiCommunicator::test(Request& request) {
  if (!request.active) return true;
  MPI_Request r = from_handle(request.handle);
  int done = 0;
  ZCOLL_MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
  if (done) request.active = false;
  return done != 0;
}

// MPI_Allreduce counts are ints: it runs once per chunk of at most kMaxMpiCount elements
// (elements are reduced independently, so chunks give the same bits as one call). Chunks rather
// than MPI-4's MPI_Allreduce_c: one path for every MPI library (those before MPI-4 lack the _c
// calls), and zcoll's user ops (half types, float min/max) keep their int-count signature, which
// a large-count call would need MPI_Op_create_c for. The cost: one more latency per 2^30
// elements, next to the second or more it takes to move them.
void MpiCommunicator::native_allreduce(const void* in, void* out, std::size_t count, DType dtype,
                                       ReduceOp op) {
  const std::size_t elem = dtype_size(dtype);
  for (std::size_t begin = 0; begin < count; begin += kMaxMpiCount) {
    const std::size_t n = std::min(kMaxMpiCount, count - begin);
    void* chunk_out = static_cast<unsigned char*>(out) + begin * elem;
    const void* send = in == out ? MPI_IN_PLACE : static_cast<const unsigned char*>(in) + begin * elem;
    ZCOLL_MPI_CHECK(MPI_Allreduce(send, chunk_out, static_cast<int>(n), mpi_datatype(dtype), mpi_op(dtype, op),
                                  comm_));
  }
  if (op == ReduceOp::kAvg) kernels::divide(out, count, dtype, size_);
  stats_.bytes_sent += 2 * count * dtype_size(dtype) * static_cast<std::size_t>(size_ - 1) / size_;
}

}  // namespace zcoll
