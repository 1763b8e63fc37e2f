// The transport interface every algorithm is written against (Gloo's transport/ split): ranks,
// non-blocking point-to-point and a reusable scratch buffer. MPI is one implementation
// (mpi_communicator.h); a shared-memory or GPU transport can be added without touching the
// algorithms.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/shared_arena.h"
#include "comm/telemetry.h"
#include "comm/topology.h"
#include "comm/watchdog.h"
#include "common/dtype.h"

namespace zcoll {

// An in-flight send or receive. The transport owns the meaning of `handle` and sets `peer`, the
// rank on the other end (what a wait that fails names); the engine's Channel sets `bytes` and
// `send` for its records.
struct Request {
  std::uint64_t handle = 0;
  std::uint64_t bytes = 0;
  int peer = -1;
  bool active = false;
  bool send = false;
};

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
};

class Communicator {
 public:
  Communicator();
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Messages between one pair of ranks with one tag arrive in the order they were sent.
  virtual Request isend(const void* buf, std::size_t bytes, int peer, int tag) = 0;
  virtual Request irecv(void* buf, std::size_t bytes, int peer, int tag) = 0;
  virtual void wait(Request& request) = 0;
  // True when the request has completed (it is then inactive, as after wait); false while it is
  // in flight. Also lets a transport without its own progress thread move messages along, so an
  // algorithm that computes between messages calls it now and then.
  virtual bool test(Request& request) = 0;
  // Abandons an in-flight request after a failure (the engine does, for every request of a
  // collective that throws): a receive never writes into its buffer afterwards; a send may or
  // may not be delivered, and is never matched by a later receive of this transport's peer
  // when the transport can prevent it. The request becomes inactive. Never throws.
  virtual void cancel(Request& request) noexcept = 0;

  // The transport's own allreduce (MPI_Allreduce for MPI), offered as algorithm "mpi" so that
  // users and benchmarks can compare side by side. Transports without one throw.
  virtual void native_allreduce(const void* in, void* out, std::size_t count, DType dtype,
                                ReduceOp op);
  virtual bool has_native_allreduce() const { return false; }
  // More ranks than cores on a node: waits yield, and busy-polling libraries collapse.
  virtual bool oversubscribed() const { return false; }

  // Shared memory across all ranks, when they all live on one node (else nullptr). The first
  // call allocates it and is collective: every rank must call it (algorithms that use it are
  // chosen identically on every rank).
  virtual bool has_shared_arena() const { return false; }
  virtual SharedArena* shared_arena() { return nullptr; }

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
  // Failure detection, for the watchdog (comm/watchdog.h). Every wait of the transport calls
  // watchdog().poll(peer) between unsuccessful polls (or check() when it wakes up).
  //   peer_alive:        false once the peer's process is known to be gone;
  //   describe_peer:     what is known about the peer's process, for messages ("" if nothing);
  //   announce:          `status` to every other rank, without blocking, on a channel of its own;
  //   next_announcement: one announcement received from another rank, if any;
  //   transport_check:   throws when the transport itself has failed (an aborted group).
  virtual bool peer_alive(int peer) = 0;
  virtual std::string describe_peer(int) { return ""; }
  virtual void announce(const PeerStatus& status) = 0;
  virtual bool next_announcement(PeerStatus& status) = 0;
  virtual void transport_check() {}
  // True when the peer reads the same CLOCK_MONOTONIC as this rank (one machine): link
  // telemetry then compares their times directly; otherwise it measures the offset first.
  virtual bool shares_clock(int) const { return true; }
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

 protected:
  // Sets node_of() from any labels, one per rank (equal label: same node); renumbers them.
  void set_nodes(const std::vector<int>& labels);
  // The transport's constructor, once rank and size are known: the id every rank agreed on.
  // Registers the communicator for zcoll.dump() and SIGUSR1 (comm/dump.h).
  void set_identity(const std::string& id, int rank, int size);

  CommStats stats_;
  Watchdog watchdog_;
  FlightRecorder recorder_;
  LinkTelemetry telemetry_;

 private:
  std::vector<unsigned char> scratch_[static_cast<int>(Scratch::kCount)];
  std::vector<int> node_of_;  // empty: one node
  int node_count_ = 1;
  int ranks_per_node_ = 0;    // set_nodes' answer for ranks_per_node()
  Topology topology_;
  std::string id_;
  int id_rank_ = 0, id_size_ = 1;
};

}  // namespace zcoll
