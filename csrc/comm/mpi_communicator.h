// The MPI transport (comm/transport.h) and the communicator over it. Point-to-point on a
// duplicate of the caller's MPI_Comm, so zcoll's messages never match the caller's; never calls
// MPI_Init (the caller, mpi4py or a benchmark main does).
//
// Waiting: MPI_Wait in MPICH busy-polls, which is fastest with a core per rank and ruinous when
// ranks outnumber cores (a spinning rank steals the core its peer needs to make progress) or when
// a communication thread shares its core with compute. So wait() polls MPI_Test with a Backoff
// (comm/backoff.h): spin for ~20 us, yield until 50 us, then sleep between polls.
// ZCOLL_WAIT=spin|yield|auto picks how soon it yields (default auto: after 64 polls when the
// ranks on this machine outnumber its cores, after the spin phase otherwise). Every wait polls the
// watchdog (comm/watchdog.h) between MPI_Tests, so it ends at the call's deadline or when a peer
// is lost; the "mpi" algorithm runs MPI_Iallreduce and waits the same way.
//
// Nodes: ranks share a node (node_of(), the shm path) as MPI_Comm_split_type(SHARED) groups them,
// unless ZCOLL_NODE_ID is set: then ranks on one machine (one kernel) with equal values form a
// node, whatever MPI says (NCCL_HOSTID's role: network namespaces on one machine emulate a
// cluster, zcoll.tools.testbed). Ranks on different machines never share a node. Oversubscription
// counts every rank on the machine: emulated nodes compete for the same cores.
//
// Failure detection: at creation the ranks exchange their pid and a machine identity (boot id
// and pid namespace), so a rank can tell whether a peer on the same machine still exists
// (kill(pid, 0), and /proc for zombies and stopped processes). Failure announcements travel on a
// duplicate of the communicator of their own, so they never match zcoll's messages.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace zcoll {

enum class WaitPolicy : int { kSpin = 0, kYield = 1 };

// The transport: MPI point-to-point on a duplicate of the caller's communicator, MPI's own
// allreduce, MPI-3 shared memory, and the peers' pids for failure detection.
class MpiTransport final : public Transport,
                           public PeerMonitor,
                           public NativeAllreduce,
                           public SharedMemory,
                           public PeerMemory {
 public:
  explicit MpiTransport(MPI_Comm parent);  // collective over parent
  ~MpiTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Request isend(const void* buf, std::size_t bytes, int peer, int tag) override;
  Request irecv(void* buf, std::size_t bytes, int peer, int tag) override;
  void wait(Request& request) override;
  bool test(Request& request) override;
  void cancel(Request& request) noexcept override;
  PeerMonitor& monitor() override { return *this; }
  NativeAllreduce* native_allreduce() override { return this; }
  // Off with ZCOLL_SHM=0; the engine asks only when every rank is on one node.
  SharedMemory* shared_memory() override { return shm_allowed_ ? this : nullptr; }

  // PeerMonitor
  bool peer_alive(int peer) override;
  std::string describe_peer(int peer) override;
  ProcessState peer_process(int peer) override;
  void announce(const PeerStatus& status) override;
  bool next_announcement(PeerStatus& status) override;
  bool shares_clock(int peer) const override { return same_machine(peer); }
  // NativeAllreduce
  void allreduce(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) override;
  // SharedMemory; the arena offers this transport as its PeerMemory where the kernel lets the
  // node's ranks read each other's memory and ZCOLL_SHM_SINGLE_COPY is unset or 1.
  SharedArena* arena() override;
  // PeerMemory: process_vm_readv / process_vm_writev
  void read(int rank, const void* remote, void* local, std::size_t bytes) override;
  void write(int rank, void* remote, const void* local, std::size_t bytes) override;

  // Where the ranks are, found at creation (see the file's comment): a node label per rank,
  // whether the ranks on this machine outnumber its cores, the id every rank agreed on.
  const std::vector<int>& node_labels() const { return node_labels_; }
  bool oversubscribed() const { return oversubscribed_; }
  const std::string& id() const { return id_; }
  // ZCOLL_TOPOLOGY restricted to these ranks, with node_of[r] the node of rank r (collective;
  // every rank throws if any cannot use the file); unknown when the variable is unset.
  Topology read_topology(const std::vector<int>& node_of) const;

  MPI_Comm comm() const { return comm_; }
  // The duplicate a shrink revokes and shrinks (comm/fault_tolerance.h): it never carries a
  // message, so the survivors' communicator starts from a communicator with no history.
  // MPI_COMM_NULL where this MPI or job cannot shrink.
  MPI_Comm shrink_comm() const { return ft_; }
  WaitPolicy wait_policy() const { return wait_policy_; }
  int machine_ranks() const { return machine_ranks_; }
  const std::string& shm_unavailable_reason() const { return shm_unavailable_; }
  void free();  // MpiCommunicator::free()

 private:
  // An MPI return code of a wait: failures become the watchdog's failure naming `peer`.
  void check_wait(int rc, int peer);
  static void settle(Request& request, MPI_Request r);  // the handle MPI_Test/MPI_Wait left
  bool same_machine(int peer) const;
  bool probe_peer_reads();  // collective: whether every rank can read every other's memory
  bool probe_peer_writes();  // collective: whether every rank can also write every other's
  // read() and write(): one copy with `rank`'s memory; a refusal is the watchdog's failure naming it.
  void copy_with_peer_or_fail(int rank, void* local, void* remote, std::size_t bytes, bool to_peer);

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm oob_ = MPI_COMM_NULL;  // failure announcements (watchdog)
  MPI_Comm ft_ = MPI_COMM_NULL;   // shrink_comm()
  int rank_ = 0;
  int size_ = 1;
  int machine_ranks_ = 1;
  WaitPolicy wait_policy_ = WaitPolicy::kSpin;
  bool oversubscribed_ = false;
  bool shm_allowed_ = true;
  std::string shm_unavailable_;  // why there is no shared arena ("" when ZCOLL_SHM allows one)
  std::vector<int> node_labels_;
  std::vector<int> world_ranks_;  // every rank's rank in MPI_COMM_WORLD (a probe's matrix index)
  std::string id_;
  MPI_Win arena_window_ = MPI_WIN_NULL;
  SharedArena arena_;
  std::vector<std::int64_t> pids_;      // every rank's process id
  std::vector<std::uint64_t> machine_;  // every rank's machine identity (boot id, pid namespace)
  PeerStatus announced_;                // the buffer of this rank's announcement sends
  std::uint64_t probe_word_ = 0;        // what the other ranks read in probe_peer_reads()
};

// The engine over an MpiTransport (comm/communicator.h), with the MPI-specific calls the
// bindings and benchmarks make.
class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm parent);

  MPI_Comm comm() const { return mpi_.comm(); }
  MPI_Comm shrink_comm() const { return mpi_.shrink_comm(); }
  WaitPolicy wait_policy() const { return mpi_.wait_policy(); }
  int machine_ranks() const { return mpi_.machine_ranks(); }  // ranks on this machine (one kernel), any node
  // Why this communicator has no shared arena even where its ranks share a node ("" if it may).
  const std::string& shm_unavailable_reason() const { return mpi_.shm_unavailable_reason(); }
  // Releases the MPI communicator and the shared window (collective: every rank calls it).
  // Idempotent. The destructor never does this (see mpi_communicator.cc). On a broken
  // communicator it releases nothing through MPI (the peers it would synchronise with may be
  // gone), nor on one for which another rank announced a failure: the MPI objects are left to
  // MPI_Finalize or the end of the process.
  void free() { mpi_.free(); }

 private:
  MpiTransport& mpi_;
};

// The MPI datatype and op that reduce like zcoll's kernels: predefined ones where MPI's agree
// (sums, products, integer min/max), zcoll's kernels as user ops elsewhere (half types have no
// MPI type; MPI_MIN/MPI_MAX on floats may drop NaNs). avg maps to sum: divide afterwards. bool
// and complex get the type and op of their lanes (common/dtype.h, reduce_lanes): count * lanes.
MPI_Datatype mpi_datatype(DType dtype);
MPI_Op mpi_op(DType dtype, ReduceOp op);

// Throws zcoll::Error with file, line, the call and MPI's error string when rc != MPI_SUCCESS.
void mpi_check(int rc, const char* call, const char* file, int line);
#define ZCOLL_MPI_CHECK(call) ::zcoll::mpi_check((call), #call, __FILE__, __LINE__)

}  // namespace zcoll
