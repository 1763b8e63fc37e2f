// The engine-side communicator every algorithm is written against: a transport (comm/
// transport.h: rank, size, non-blocking point-to-point, the peer monitor and optional
// capabilities) composed with what the engine keeps per communicator: the watchdog (deadlines,
// lost ranks), the flight recorder, link telemetry, which ranks share a node, the topology, the
// scratch areas and the traffic counters. MPI (mpi_communicator.h) and the in-process test
// transport (inproc_communicator.h) differ only in the transport they hand this class; nothing
// here assumes either.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/shared_arena.h"
#include "comm/telemetry.h"
#include "comm/topology.h"
#include "comm/transport.h"
#include "comm/watchdog.h"
#include "common/dtype.h"

namespace zcoll {

// The communicator's reusable scratch areas, one per purpose, so that an algorithm calling
// another (top-k's dense fallback runs a ring) never overwrites what its caller keeps.
enum class Scratch : int {
  kPipelineSlots = 0,   // the engine's receive slots (collectives/pipeline.h)
  kPartial,             // partial sums of reduce-scatter / interior tree ranks
  kCompressedPayloads,  // the compressed ring's per-segment payloads
  kCodecFloats,         // float32 temporaries of a ring codec
  kWidened,             // a 2-byte input widened to float32 (sparsifiers)
  kSelection,           // sparsifier (index, value) selection
  kWideResult,          // float32 result before rounding to a 2-byte output
  kPairs,               // every rank's (index, value) pairs
  kResidual,            // a scratch error-feedback residual (measure_error without one)
  kHierarchicalInput,   // the compressed hierarchical allreduce's input with the residual folded in
  kCount
};

// Traffic counters, per communicator, for benchmarks and (later) monitoring.
struct CommStats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t messages_sent = 0;
  std::uint64_t collectives = 0;
  std::uint64_t bytes_read_from_peers = 0;  // shm single copy: read straight from other ranks' memory
  std::uint64_t bytes_written_to_peers = 0;  // shm single copy: written straight into other ranks' memory
};

class Communicator {
 public:
  // Takes the transport, attaches the watchdog to it and reads its capabilities. A transport's
  // own communicator class (MpiCommunicator, InProcCommunicator) then sets what its transport
  // found out: nodes, topology, oversubscription, identity.
  explicit Communicator(std::unique_ptr<Transport> transport);
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // The transport's point-to-point (comm/transport.h); sends are counted in stats().
  Request isend(const void* buf, std::size_t bytes, int peer, int tag) {
    Request request = transport_->isend(buf, bytes, peer, tag);
    stats_.bytes_sent += bytes;
    stats_.messages_sent += 1;
    return request;
  }
  Request irecv(void* buf, std::size_t bytes, int peer, int tag) {
    return transport_->irecv(buf, bytes, peer, tag);
  }
  void wait(Request& request) { transport_->wait(request); }
  bool test(Request& request) { return transport_->test(request); }
  void cancel(Request& request) noexcept { transport_->cancel(request); }

  // The transport's own allreduce (MPI_Allreduce for MPI), offered as algorithm "mpi" so that
  // users and benchmarks can compare side by side; std::invalid_argument without one.
  void native_allreduce(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op);
  bool has_native_allreduce() const { return native_ != nullptr; }
  // More ranks than cores on a node: waits yield, and busy-polling libraries collapse.
  bool oversubscribed() const { return oversubscribed_; }

  // Shared memory across all ranks, when the transport offers it and they all live on one node
  // (else nullptr). The first call allocates it and is collective (SharedMemory).
  bool has_shared_arena() const { return shared_memory_ != nullptr && node_count_ == 1; }
  SharedArena* shared_arena() { return has_shared_arena() ? shared_memory_->arena() : nullptr; }

  // Which ranks share a node (memory, and so the shm path): node_of(r) is in 0..node_count()-1,
  // nodes numbered in the order of their lowest rank, the same answer on every rank. The
  // transport decides (MPI: its shared-memory split, refined by ZCOLL_NODE_ID); until it says
  // otherwise every rank is on node 0. Hierarchical schedules and `zcoll probe` read this.
  int node_of(int rank) const;
  int node_count() const { return node_count_; }
  std::vector<int> local_ranks() const;  // the ranks of this rank's node, ascending
  // L when every node holds L ranks, 0 when nodes differ in size (the hierarchical allreduce
  // needs equal nodes).
  int ranks_per_node() const;

  // Link bandwidths and the ring order derived from them (comm/topology.h), for the
  // topology-ordered ring and `auto`: from ZCOLL_TOPOLOGY (MPI), set_topology (Python's
  // Communicator.set_topology) or nothing (Topology::known() false). Every rank must hold the
  // same one: check mode compares the ring's fingerprint.
  const Topology& topology() const { return topology_; }
  void set_topology(Topology topology);

  // Failure detection: the transport's view of its peers (comm/transport.h), which the
  // watchdog reads; every wait of the transport polls the watchdog (comm/watchdog.h).
  PeerMonitor& monitor() { return monitor_; }
  bool shares_clock(int peer) const { return monitor_.shares_clock(peer); }
  Watchdog& watchdog() { return watchdog_; }
  const Watchdog& watchdog() const { return watchdog_; }
  FlightRecorder& recorder() { return recorder_; }
  const FlightRecorder& recorder() const { return recorder_; }
  LinkTelemetry& telemetry() { return telemetry_; }
  // Names the communicator the same on every rank (set by the transport at creation), for
  // flight-recorder dumps (comm/dump.h); "" until then.
  const std::string& id() const { return id_; }
  int id_rank() const { return id_rank_; }
  int id_size() const { return id_size_; }

  // A reusable scratch area of at least `bytes`, owned by the communicator (grown, never shrunk).
  void* scratch(std::size_t bytes, Scratch purpose);

  CommStats& stats() { return stats_; }

  Transport& transport() { return *transport_; }

 protected:
  // Sets node_of() from any labels, one per rank (equal label: same node); renumbers them.
  void set_nodes(const std::vector<int>& labels);
  void set_oversubscribed(bool oversubscribed) { oversubscribed_ = oversubscribed; }
  // Once rank and size are known: the id every rank agreed on. Registers the communicator for
  // zcoll.dump() and SIGUSR1 (comm/dump.h).
  void set_identity(const std::string& id);

 private:
  std::unique_ptr<Transport> transport_;
  PeerMonitor& monitor_;
  NativeAllreduce* native_;      // the transport's, or null
  SharedMemory* shared_memory_;  // the transport's, or null
  int rank_, size_;
  bool oversubscribed_ = false;
  CommStats stats_;
  Watchdog watchdog_;
  FlightRecorder recorder_;
  LinkTelemetry telemetry_;
  std::vector<unsigned char> scratch_[static_cast<int>(Scratch::kCount)];
  std::vector<int> node_of_;  // empty: one node
  int node_count_ = 1;
  int ranks_per_node_ = 0;    // set_nodes' answer for ranks_per_node()
  Topology topology_;
  std::string id_;
  int id_rank_ = 0, id_size_ = 1;
};

}  // namespace zcoll
