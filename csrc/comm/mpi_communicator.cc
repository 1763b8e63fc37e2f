// The MPI transport and MpiCommunicator (mpi_communicator.h).
#include "comm/mpi_communicator.h"

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "comm/backoff.h"
#include "comm/fault_tolerance.h"
#include "common/check.h"
#include "common/env.h"
#include "config.h"
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

// This kernel's boot id: equal for every process on one machine (namespaces and containers
// included), different across machines. The host name where /proc does not say.
std::string machine_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (in >> id && !id.empty()) return id;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// Where each rank lives, from one allgather: its machine, MPI's shared-memory group (named by its
// lowest rank), ZCOLL_NODE_ID and its rank in MPI_COMM_WORLD (what a probe's matrix is indexed by).
struct Placement {
  std::vector<int> node_labels;  // equal for ranks on one node
  std::vector<int> world_ranks;
  int machine_ranks = 1;         // ranks on this rank's machine
};

// Ranks share a node when they are on one machine and have equal ZCOLL_NODE_IDs; ranks without
// one (the usual case) group as MPI_Comm_split_type(SHARED) does. Collective over comm.
Placement locate_ranks(MPI_Comm comm, int rank, int mpi_node) {
  constexpr std::size_t kText = 256;  // ZCOLL_NODE_ID holds at most 255 characters (env.cc)
  struct Key {
    int mpi_node;
    int world_rank;
    char machine[kText];
    char node_id[kText];
  } mine{};
  mine.mpi_node = mpi_node;
  ZCOLL_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &mine.world_rank));
  const std::string machine = machine_id();
  const std::string& node_id = env::get_string(env::Var::kNodeId);
  ZCOLL_CHECK_LT(node_id.size(), kText, "ZCOLL_NODE_ID length");
  std::memcpy(mine.machine, machine.data(), std::min(machine.size(), kText - 1));
  std::memcpy(mine.node_id, node_id.data(), node_id.size());
  int size = 0;
  ZCOLL_MPI_CHECK(MPI_Comm_size(comm, &size));
  std::vector<Key> all(size);
  ZCOLL_MPI_CHECK(MPI_Allgather(&mine, sizeof(Key), MPI_BYTE, all.data(), sizeof(Key), MPI_BYTE, comm));
  auto same_machine = [&](int a, int b) { return std::strcmp(all[a].machine, all[b].machine) == 0; };
  auto same_node = [&](int a, int b) {
    if (!same_machine(a, b) || std::strcmp(all[a].node_id, all[b].node_id) != 0) return false;
    return all[a].node_id[0] != '\0' || all[a].mpi_node == all[b].mpi_node;
  };
  Placement out;
  out.node_labels.resize(size);
  out.machine_ranks = 0;
  for (int r = 0; r < size; ++r) {
    out.world_ranks.push_back(all[r].world_rank);
    out.node_labels[r] = r;
    for (int q = 0; q < r; ++q)
      if (same_node(q, r)) {
        out.node_labels[r] = out.node_labels[q];
        break;
      }
    out.machine_ranks += same_machine(r, rank) ? 1 : 0;
  }
  return out;
}

WaitPolicy choose_wait_policy(bool oversubscribed) {
  const std::string& v = env::get_choice(env::Var::kWait);
  if (v == "spin") return WaitPolicy::kSpin;
  if (v == "yield") return WaitPolicy::kYield;
  return oversubscribed ? WaitPolicy::kYield : WaitPolicy::kSpin;
}

// The failure announcements' tag (on their own communicator).
constexpr int kTagStatus = 1;

// Two processes with the same identity see each other's pids: the same machine (machine_id())
// and the same pid namespace (containers on one machine have their own).
std::uint64_t machine_identity() {
  std::string id = machine_id();
  struct stat st {};
  if (stat("/proc/self/ns/pid", &st) == 0) id += ":" + std::to_string(st.st_ino);
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
  return h | 1;
}

Request active_request(std::uint64_t handle, int peer) {
  Request request;
  request.handle = handle;
  request.peer = peer;
  request.active = true;
  return request;
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

// The MPI type of one element of a numeric dtype (bool and complex: of one lane, see allreduce).
MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kInt8: return MPI_INT8_T;
    case DType::kUInt8: return MPI_UINT8_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kFloat16:
    case DType::kBFloat16: return half_datatype();
    case DType::kBool:
    case DType::kComplex32:
    case DType::kComplex64:
    case DType::kComplex128: break;
  }
  return mpi_datatype(reduce_lanes(dtype, ReduceOp::kSum).dtype);
}

MPI_Op mpi_op(DType dtype, ReduceOp op) {
  const ReduceLanes lanes = reduce_lanes(dtype, op);
  dtype = lanes.dtype;
  op = lanes.op;
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
    case ReduceOp::kBand: return MPI_BAND;  // integers only (validate_op)
    case ReduceOp::kBor: return MPI_BOR;
    case ReduceOp::kBxor: return MPI_BXOR;
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

MpiTransport::MpiTransport(MPI_Comm parent) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  ZCOLL_REQUIRE(initialized, "MPI is not initialised: call MPI_Init (or import mpi4py.MPI) first");
  ZCOLL_REQUIRE(parent != MPI_COMM_NULL, "cannot build a communicator from MPI_COMM_NULL");
  ZCOLL_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  ZCOLL_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  ZCOLL_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ZCOLL_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_Comm shared;
  ZCOLL_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared));
  int mpi_node = rank_;  // MPI's node, named by its lowest rank
  ZCOLL_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &mpi_node, 1, MPI_INT, MPI_MIN, shared));
  int mpi_node_size = 0;
  ZCOLL_MPI_CHECK(MPI_Comm_size(shared, &mpi_node_size));
  ZCOLL_MPI_CHECK(MPI_Comm_free(&shared));
  Placement placement = locate_ranks(comm_, rank_, mpi_node);
  node_labels_ = std::move(placement.node_labels);
  world_ranks_ = std::move(placement.world_ranks);
  machine_ranks_ = placement.machine_ranks;
  // Under SMPI every simulated rank is a thread of one host process, so this host's cores say
  // nothing about the simulated machine: the platform files give each host `core="8"` and the
  // hostfile puts at most that many ranks on it (node-N:8), so a simulated node is never
  // oversubscribed, and auto and the wait policy there choose as on the cluster it models.
  oversubscribed_ = !ZCOLL_WITH_SMPI && machine_ranks_ > cpus_available(machine_ranks_);
  wait_policy_ = choose_wait_policy(oversubscribed_);
  shm_allowed_ = env::get_bool(env::Var::kShm);
  // MPI_Win_allocate_shared needs every rank in MPI's own shared-memory domain; ZCOLL_NODE_ID can
  // group ranks MPI holds apart (MPICH's MPIR_CVAR_NOLOCAL, separate hosts to the launcher), and
  // the window would then fail at the first call: no arena instead (every rank agrees: one rank
  // sees all size_ ranks in its domain only if every rank does).
  if (!shm_allowed_) {
    shm_unavailable_ = "ZCOLL_SHM=0";
  } else if (mpi_node_size != size_) {
    shm_allowed_ = false;
    shm_unavailable_ = detail::concat("MPI puts these ", size_, " ranks in more than one shared-memory domain (",
                                      mpi_node_size, " in this rank's), so MPI_Win_allocate_shared cannot span them");
  }
  // Failure detection (the watchdog): an announcement channel and every rank's pid and machine.
  ZCOLL_MPI_CHECK(MPI_Comm_dup(comm_, &oob_));
  ZCOLL_MPI_CHECK(MPI_Comm_set_errhandler(oob_, MPI_ERRORS_RETURN));
  // A shrink of comm_ itself, after a failed collective on it, left the survivors' communicator
  // mismatching messages under Open MPI 5.0 (MPI_ERR_TRUNCATE, rendezvous sends that never
  // complete, then crashes in the next revoke or shrink); one of a duplicate that carried no
  // message works (docs/recovery.md). Every rank gets the same answer, so all or none dup.
  if (shrink_unavailable_reason().empty()) {
    ZCOLL_MPI_CHECK(MPI_Comm_dup(comm_, &ft_));
    ZCOLL_MPI_CHECK(MPI_Comm_set_errhandler(ft_, MPI_ERRORS_RETURN));
  }
  // The third number names the communicator alike on every rank (rank 0's creation count).
  static std::atomic<std::int64_t> created{0};
  const std::int64_t mine[3] = {static_cast<std::int64_t>(getpid()), static_cast<std::int64_t>(machine_identity()),
                                ++created};
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(size_));
  ZCOLL_MPI_CHECK(MPI_Allgather(mine, 3, MPI_INT64_T, all.data(), 3, MPI_INT64_T, comm_));
  for (int r = 0; r < size_; ++r) {
    pids_.push_back(all[3 * r]);
    machine_.push_back(static_cast<std::uint64_t>(all[3 * r + 1]));
  }
  for (int r = 0; r < size_; ++r)
    if (r != rank_) note_exit_peer(same_machine(r) ? pids_[static_cast<std::size_t>(r)] : -1);
  id_ = detail::concat(std::hex, machine_[0] & 0xfffff, std::dec, "-", pids_[0], "-", all[2]);
}

// ZCOLL_TOPOLOGY, read by every rank; if any rank fails (no file, another placement), every rank
// throws, so none goes on to a collective the others never enter. Collective over comm_.
Topology MpiTransport::read_topology(const std::vector<int>& node_of) const {
  const std::string& path = env::get_string(env::Var::kTopology);
  if (path.empty()) return {};
  std::string error;
  Topology topology;
  try {
    int world_size = 0;
    ZCOLL_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    topology = topology_from_probe(read_probe_file(path), path, world_size, world_ranks_, node_of);
  } catch (const std::exception& e) {
    error = e.what();
  }
  int ok = error.empty() ? 1 : 0;
  ZCOLL_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm_));
  if (!error.empty()) throw std::invalid_argument(error);
  ZCOLL_REQUIRE(ok, "ZCOLL_TOPOLOGY: another rank could not use '", path, "' (its message says why)");
  return topology;
}

MpiCommunicator::MpiCommunicator(MPI_Comm parent)
    : Communicator(std::make_unique<MpiTransport>(parent)), mpi_(static_cast<MpiTransport&>(transport())) {
  set_nodes(mpi_.node_labels());
  std::vector<int> nodes(static_cast<std::size_t>(size()));
  for (int r = 0; r < size(); ++r) nodes[r] = node_of(r);
  set_topology(mpi_.read_topology(nodes));
  set_oversubscribed(mpi_.oversubscribed());
  set_identity(mpi_.id());
}

// Never calls MPI: freeing a window or a communicator is collective, and destruction order
// (garbage collection in Python) differs between ranks. A communicator not freed by free() is
// left to MPI_Finalize (mpi4py's model; the Python layer warns).
MpiTransport::~MpiTransport() = default;

void MpiTransport::free() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  // A peer's failure announcement breaks the communicator for every rank, even one that has not
  // waited since: the collective frees below would wait for ranks that may be gone.
  int announced = 0;
  MPI_Status st;
  if (!finalized && oob_ != MPI_COMM_NULL) MPI_Iprobe(MPI_ANY_SOURCE, kTagStatus, oob_, &announced, &st);
  MPI_Win window = arena_window_;
  MPI_Comm comm = comm_, oob = oob_, ft = ft_;
  arena_window_ = MPI_WIN_NULL;
  arena_.regions.clear();
  comm_ = oob_ = ft_ = MPI_COMM_NULL;
  if (finalized || watchdog().broken() || announced) return;
  if (window != MPI_WIN_NULL) ZCOLL_MPI_CHECK(MPI_Win_free(&window));
  if (ft != MPI_COMM_NULL) ZCOLL_MPI_CHECK(MPI_Comm_free(&ft));
  ZCOLL_MPI_CHECK(MPI_Comm_free(&oob));
  ZCOLL_MPI_CHECK(MPI_Comm_free(&comm));
}

namespace {
// Reads one byte of every page of every rank's data region, so that this process maps them.
void touch_pages(const SharedArena& arena, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  unsigned char sum = 0;
  for (std::size_t r = 0; r < arena.regions.size(); ++r) {
    const volatile unsigned char* data = arena.data(static_cast<int>(r));
    for (std::size_t at = 0; at < bytes; at += page) sum ^= data[at];
  }
  static_cast<void>(sum);
}

// One copy between this process and a peer's memory (process_vm_readv, or process_vm_writev when
// `to_peer`), looping over partial transfers and retrying EINTR; 0, or the errno that stopped it.
int copy_with_peer(pid_t pid, void* local, void* remote, std::size_t bytes, bool to_peer) {
  auto here = reinterpret_cast<std::uintptr_t>(local), there = reinterpret_cast<std::uintptr_t>(remote);
  while (bytes > 0) {
    iovec mine{reinterpret_cast<void*>(here), bytes}, theirs{reinterpret_cast<void*>(there), bytes};
    const ssize_t moved = to_peer ? process_vm_writev(pid, &mine, 1, &theirs, 1, 0)
                                  : process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
    if (moved > 0) {
      here += static_cast<std::uintptr_t>(moved);
      there += static_cast<std::uintptr_t>(moved);
      bytes -= static_cast<std::size_t>(moved);
      continue;
    }
    const int error = moved < 0 ? errno : EIO;
    if (error != EINTR) return error;
  }
  return 0;
}
}  // namespace

// Cross-memory attach for the shm algorithm's single copy (shared_arena.h, PeerMemory): reads of
// a peer's `in` and writes of reduced pieces into its `out`. The kernel allows it between one
// user's processes unless Yama's ptrace_scope (>= 1) or a seccomp filter (some container runtimes)
// forbids it, which arena() finds out once.
void MpiTransport::read(int rank, const void* remote, void* local, std::size_t bytes) {
  copy_with_peer_or_fail(rank, local, const_cast<void*>(remote), bytes, false);
}

void MpiTransport::write(int rank, void* remote, const void* local, std::size_t bytes) {
  copy_with_peer_or_fail(rank, const_cast<void*>(local), remote, bytes, true);
}

void MpiTransport::copy_with_peer_or_fail(int rank, void* local, void* remote, std::size_t bytes, bool to_peer) {
  const int error = copy_with_peer(static_cast<pid_t>(pids_[static_cast<std::size_t>(rank)]), local, remote, bytes,
                                   to_peer);
  if (error == 0) return;
  watchdog().fail_transport(rank,
                            detail::concat(to_peer ? "writing" : "reading", " its memory in one copy (",
                                           to_peer ? "process_vm_writev" : "process_vm_readv", ") failed: ",
                                           std::strerror(error),
                                           " (ZCOLL_SHM_SINGLE_COPY=0 copies through the shared window instead)"),
                            !peer_alive(rank));
}

// Whether every rank may also write every other rank's memory: each writes the word it read in
// probe_peer_reads() back unchanged (the same value, so a concurrent reader sees no change), and
// the ranks agree. A kernel may allow reads and refuse writes (a seccomp filter naming one
// call); then the single copy gathers with reads as before. Collective over comm_.
bool MpiTransport::probe_peer_writes() {
  bool ok = true;
  for (int r = 0; r < size_ && ok; ++r) {
    if (r == rank_) continue;
    std::uint64_t word = static_cast<std::uint64_t>(pids_[static_cast<std::size_t>(r)]);
    iovec from{&word, sizeof(word)};
    iovec to{reinterpret_cast<void*>(static_cast<std::uintptr_t>(arena_.posted(r, 3))), sizeof(word)};
    ok = process_vm_writev(static_cast<pid_t>(pids_[static_cast<std::size_t>(r)]), &from, 1, &to, 1, 0) ==
         static_cast<ssize_t>(sizeof(word));
  }
  int all = ok ? 1 : 0;
  ZCOLL_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm_));
  return all == 1;
}

// Whether every rank may read every other rank of the node's memory: each rank posts the
// address of a word holding its pid in its arena flag slot 3, reads every other rank's, and
// the ranks agree (an allreduce), so that all of them take the same path. Collective over comm_.
bool MpiTransport::probe_peer_reads() {
  bool ok = env::get_bool(env::Var::kShmSingleCopy);
  probe_word_ = static_cast<std::uint64_t>(pids_[static_cast<std::size_t>(rank_)]);
  arena_.post(rank_, 3, reinterpret_cast<std::uintptr_t>(&probe_word_));
  ZCOLL_MPI_CHECK(MPI_Barrier(comm_));
  for (int r = 0; r < size_ && ok; ++r) {
    if (r == rank_) continue;
    std::uint64_t word = 0;
    iovec to{&word, sizeof(word)};
    iovec from{reinterpret_cast<void*>(static_cast<std::uintptr_t>(arena_.posted(r, 3))), sizeof(word)};
    ok = process_vm_readv(static_cast<pid_t>(pids_[static_cast<std::size_t>(r)]), &to, 1, &from, 1, 0) ==
             static_cast<ssize_t>(sizeof(word)) &&
         word == static_cast<std::uint64_t>(pids_[static_cast<std::size_t>(r)]);
  }
  int all = ok ? 1 : 0;
  ZCOLL_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm_));
  return all == 1;
}

SharedArena* MpiTransport::arena() {
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
  arena_.watchdog = &watchdog();
  // Zero this rank's flags, then make sure every rank has done so before anyone polls them.
  for (int f = 0; f < kSharedFlags; ++f) new (&arena_.flags(rank_)[f]) SharedFlag();
  // Fault the whole arena in now: the owner writes its region (first touch places the pages on
  // its NUMA node), then every process maps every region's pages. Otherwise each page becomes
  // resident the first time a call's size and layout reach it, and RSS creeps up for thousands
  // of calls (the soak measured +2.4 MiB of shared memory after its first 1,000 calls).
  std::memset(arena_.data(rank_), 0, data_bytes);
  ZCOLL_MPI_CHECK(MPI_Barrier(comm_));
  touch_pages(arena_, data_bytes);
  if (probe_peer_reads()) {
    arena_.peer_memory = this;
    arena_.peer_writes = probe_peer_writes();
  }
  return &arena_;
}

Request MpiTransport::isend(const void* buf, std::size_t bytes, int peer, int tag) {
  MPI_Request r;
  ZCOLL_MPI_CHECK(MPI_Isend(buf, to_int_count(bytes), MPI_BYTE, peer, tag, comm_, &r));
  Request request = active_request(to_handle(r), peer);
  request.send = true;
  return request;
}

Request MpiTransport::irecv(void* buf, std::size_t bytes, int peer, int tag) {
  MPI_Request r;
  ZCOLL_MPI_CHECK(MPI_Irecv(buf, to_int_count(bytes), MPI_BYTE, peer, tag, comm_, &r));
  return active_request(to_handle(r), peer);
}

// After MPI_Test / MPI_Wait, before check_wait may throw: a request that completed, with an error
// too (a lost peer under ULFM, a revoked communicator), has been freed by MPI and its handle set
// to MPI_REQUEST_NULL. Left active with the old handle, the failed call's clean-up (cancel) would
// MPI_Cancel and MPI_Request_free a request MPI had already freed and perhaps handed to a later
// call: Open MPI's ob1 then unlinks it from a queue twice and returns it to its free list twice,
// and one of the survivors crashed inside ob1 a few calls after the shrink. Still pending (an
// error on a wildcard receive), it stays active and is cancelled as before.
void MpiTransport::settle(Request& request, MPI_Request r) {
  request.handle = to_handle(r);
  if (r == MPI_REQUEST_NULL) request.active = false;
}

void MpiTransport::check_wait(int rc, int peer) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0, error_class = 0;
  MPI_Error_string(rc, text, &len);
  MPI_Error_class(rc, &error_class);
  bool lost = peer >= 0 && !peer_alive(peer);
#ifdef MPIX_ERR_PROC_FAILED
  lost = lost || error_class == MPIX_ERR_PROC_FAILED;
#endif
  watchdog().fail_transport(peer, "MPI reported: " + std::string(text, len), lost);
}

void MpiTransport::wait(Request& request) {
  if (!request.active) return;
  MPI_Request r = from_handle(request.handle);
  if (ZCOLL_WITH_SMPI) {
    // Simulated time advances only while a rank blocks: polling would stall the simulation or,
    // with SMPI's per-test delay, round every wait up to that delay. No deadline in a simulation.
    const int rc = MPI_Wait(&r, MPI_STATUS_IGNORE);
    settle(request, r);
    check_wait(rc, request.peer);
    request.active = false;
    return;
  }
  Backoff backoff(wait_policy_ == WaitPolicy::kYield);
  for (int done = 0;;) {
    const int rc = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    settle(request, r);
    check_wait(rc, request.peer);
    if (done) break;
    backoff.pause();
    watchdog().poll(request.peer);
  }
  request.active = false;
}

bool MpiTransport::test(Request& request) {
  if (!request.active) return true;
  MPI_Request r = from_handle(request.handle);
  int done = 0;
  const int rc = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
  settle(request, r);
  check_wait(rc, request.peer);
  if (done) request.active = false;
  return done != 0;
}

// A receive: MPI_Cancel, then MPI_Request_free; the cancellation completes in the background,
// and a cancelled receive never writes into its buffer. A send is only freed (it completes or
// not in the background; it only reads its buffer): cancelling sends is deprecated in MPI-4, and
// MPICH over UCX crashes in ucp_request_cancel on a rendezvous send to a stopped peer.
void MpiTransport::cancel(Request& request) noexcept {
  if (!request.active) return;
  request.active = false;
  if (comm_ == MPI_COMM_NULL) return;
  MPI_Request r = from_handle(request.handle);
  if (r == MPI_REQUEST_NULL) return;
  if (!request.send) MPI_Cancel(&r);
  MPI_Request_free(&r);
}

// MPI_Allreduce counts are ints: it runs once per chunk of at most kMaxMpiCount elements
// (elements are reduced independently, so chunks give the same bits as one call). Chunks rather
// than MPI-4's MPI_Allreduce_c: one path for every MPI library (those before MPI-4 lack the _c
// calls), and zcoll's user ops (half types, float min/max) keep their int-count signature, which
// a large-count call would need MPI_Op_create_c for. The cost: one more latency per 2^30
// elements, next to the second or more it takes to move them. With the watchdog on, each chunk is
// an MPI_Iallreduce waited for with the watchdog's polls (a blocking MPI_Allreduce could wait for
// a stopped rank forever); off, MPI_Allreduce itself.
void MpiTransport::allreduce(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) {
  // bool and complex as the lanes the kernels reduce them as (common/dtype.h): uint8 with MPI's
  // bitwise ops, two real elements per complex one (MPI_C_*_COMPLEX has no half, and MPI_SUM on
  // it would add componentwise anyway).
  const ReduceLanes lanes = reduce_lanes(dtype, op);
  count *= lanes.lanes;
  dtype = lanes.dtype;
  op = lanes.op;
  const std::size_t elem = dtype_size(dtype);
  for (std::size_t begin = 0; begin < count; begin += kMaxMpiCount) {
    const int n = static_cast<int>(std::min(kMaxMpiCount, count - begin));
    void* chunk_out = static_cast<unsigned char*>(out) + begin * elem;
    const void* send = in == out ? MPI_IN_PLACE : static_cast<const unsigned char*>(in) + begin * elem;
    if (!watchdog().enabled() || ZCOLL_WITH_SMPI) {
      ZCOLL_MPI_CHECK(MPI_Allreduce(send, chunk_out, n, mpi_datatype(dtype), mpi_op(dtype, op), comm_));
      continue;
    }
    MPI_Request r;
    ZCOLL_MPI_CHECK(MPI_Iallreduce(send, chunk_out, n, mpi_datatype(dtype), mpi_op(dtype, op), comm_, &r));
    Backoff backoff(wait_policy_ == WaitPolicy::kYield);
    for (int done = 0;;) {
      check_wait(MPI_Test(&r, &done, MPI_STATUS_IGNORE), -1);
      if (done) break;
      backoff.pause();
      watchdog().poll();
    }
  }
  if (op == ReduceOp::kAvg) kernels::divide(out, count, dtype, size_);
}

bool MpiTransport::same_machine(int peer) const {
  return machine_[static_cast<std::size_t>(peer)] != 0 && machine_[static_cast<std::size_t>(peer)] == machine_[rank_];
}

bool MpiTransport::peer_alive(int peer) { return peer_process(peer) != ProcessState::kGone; }

ProcessState MpiTransport::peer_process(int peer) {
  return same_machine(peer) ? process_state(pids_[static_cast<std::size_t>(peer)]) : ProcessState::kUnknown;
}

std::string MpiTransport::describe_peer(int peer) {
  if (!same_machine(peer)) return "on another machine";
  const std::int64_t pid = pids_[static_cast<std::size_t>(peer)];
  switch (process_state(pid)) {
    case ProcessState::kGone: return detail::concat("its process, pid ", pid, " on this machine, has exited");
    case ProcessState::kStopped:
      return detail::concat("its process, pid ", pid, " on this machine, is stopped: SIGSTOP or a debugger");
    case ProcessState::kRunning:
    case ProcessState::kUnknown: break;
  }
  return detail::concat("its process, pid ", pid, " on this machine, is running but not in a zcoll call");
}

void MpiTransport::announce(const PeerStatus& status) {
  if (oob_ == MPI_COMM_NULL) return;
  announced_ = status;  // the send buffer outlives the sends, which are never waited for
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request req;
    if (MPI_Isend(&announced_, sizeof announced_, MPI_BYTE, r, kTagStatus, oob_, &req) == MPI_SUCCESS)
      MPI_Request_free(&req);
  }
}

bool MpiTransport::next_announcement(PeerStatus& status) {
  if (oob_ == MPI_COMM_NULL) return false;
  int flag = 0;
  MPI_Status st;
  int rc = MPI_Iprobe(MPI_ANY_SOURCE, kTagStatus, oob_, &flag, &st);
  if (rc != MPI_SUCCESS && acknowledge_failures(oob_, rc))  // a failed rank, under ULFM
    rc = MPI_Iprobe(MPI_ANY_SOURCE, kTagStatus, oob_, &flag, &st);
  ZCOLL_MPI_CHECK(rc);
  if (!flag) return false;
  int bytes = 0;
  MPI_Get_count(&st, MPI_BYTE, &bytes);
  std::vector<unsigned char> buf(static_cast<std::size_t>(bytes > 0 ? bytes : 1));
  ZCOLL_MPI_CHECK(MPI_Recv(buf.data(), bytes, MPI_BYTE, st.MPI_SOURCE, kTagStatus, oob_, MPI_STATUS_IGNORE));
  if (static_cast<std::size_t>(bytes) != sizeof status) return false;
  std::memcpy(&status, buf.data(), sizeof status);
  return true;
}

}  // namespace zcoll
