// zcoll._C.Comm: built from an MPI Fortran handle (mpi4py's Comm.py2f()), which every MPI
// implementation converts back with MPI_Comm_f2c, whatever its C handle type. Lifetime follows
// mpi4py: free() is the collective release (GIL released, MPI errors raise ZcollError); an
// unfreed communicator that is garbage-collected only warns (ResourceWarning) and leaks its MPI
// communicator, since collection happens in a different order on every rank. Python's atexit
// handler (communicator.py) frees the live ones before MPI_Finalize.
#include <mpi.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>

#include "bindings.h"
#include "bindings/enums.h"
#include "comm/topology.h"
#include "common/check.h"
#include "collectives/link_stats.h"
#include "comm/dump.h"

namespace py = pybind11;

namespace zcoll::bindings {
namespace {

// A p x p matrix as one row-major vector; ValueError for rows of another length.
std::vector<double> flatten(const std::vector<std::vector<double>>& rows) {
  std::vector<double> out;
  for (const auto& row : rows) {
    ZCOLL_REQUIRE(row.size() == rows.size(), "bandwidth: a square matrix, not ", rows.size(), " rows of ", row.size());
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

}  // namespace

CommHandle::CommHandle(long long fortran_handle, bool check_args)
    : check(check_args),
      comm_(std::make_unique<MpiCommunicator>(MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle)))) {}

CommHandle::~CommHandle() {
  if (!comm_) return;
  // Dealloc runs with the GIL held. The MpiCommunicator's destructor makes no MPI call.
  if (PyErr_WarnEx(PyExc_ResourceWarning,
                   "zcoll.Communicator was garbage-collected without free(); its MPI communicator is "
                   "leaked (freeing is collective: call free() or use `with` on every rank)",
                   1) != 0)
    PyErr_WriteUnraisable(nullptr);
}

void CommHandle::free() {
  if (!comm_) return;
  comm_->free();
  comm_.reset();
}

py::class_<CommHandle> bind_comm(py::module_& m) {
  py::class_<CommHandle> cls(m, "Comm",
                             "The C++ half of zcoll.Communicator (subclass it; do not use directly).");
  cls.def(py::init([](long long fortran_handle, bool check) {
            py::gil_scoped_release release;  // MPI_Comm_dup is collective
            return std::make_unique<CommHandle>(fortran_handle, check);
          }),
          py::arg("fortran_handle"), py::arg("check") = false)
      .def_property_readonly("rank", [](CommHandle& c) { return c.comm().rank(); })
      .def_property_readonly("size", [](CommHandle& c) { return c.comm().size(); })
      .def_property_readonly(
          "local_size", [](CommHandle& c) { return c.comm().local_ranks().size(); },
          "Ranks on this rank's node (shared memory; ZCOLL_NODE_ID splits one machine into nodes).")
      .def_property_readonly(
          "shm_unavailable", [](CommHandle& c) { return c.comm().shm_unavailable_reason(); },
          "Why this communicator has no shared-memory arena (algorithm 'shm', the hierarchical node step) even "
          "where its ranks share a node: 'ZCOLL_SHM=0', or MPI holds them in more than one shared-memory domain; "
          "'' when it may have one.")
      .def_property_readonly("node_count", [](CommHandle& c) { return c.comm().node_count(); },
                             "Nodes the ranks are on.")
      .def("node_of", [](CommHandle& c, int rank) { return c.comm().node_of(rank); }, py::arg("rank"),
           "The node of `rank`, 0..node_count-1, numbered in order of each node's lowest rank.")
      .def_property_readonly("local_ranks", [](CommHandle& c) { return c.comm().local_ranks(); },
                             "The ranks on this rank's node, ascending.")
      .def(
          "_set_topology",
          [](CommHandle& c, const std::vector<std::vector<double>>& bandwidth) {
            if (bandwidth.empty()) {
              c.comm().set_topology(Topology{});
              return;
            }
            const int p = c.comm().size();
            const std::vector<double> bw = flatten(bandwidth);
            Topology t = topology_from_bandwidth(bw, p);
            // The node map is this communicator's (ZCOLL_NODE_ID or MPI's), so the ratio of rule 6
            // is known here as it is from ZCOLL_TOPOLOGY.
            std::vector<int> node_of(p);
            for (int r = 0; r < p; ++r) node_of[r] = c.comm().node_of(r);
            t.node_link_ratio = node_link_ratio(bw, p, node_of);
            t.slow_node_factor = slow_node_factor(bw, p, node_of);
            c.comm().set_topology(std::move(t));
          },
          py::arg("bandwidth"),
          "Sets the link bandwidths (a size x size matrix of bytes/s, row sends to column; [] clears).")
      .def_property_readonly(
          "node_link_ratio", [](CommHandle& c) { return c.comm().topology().node_link_ratio; },
          "Median bandwidth within a node over the median across nodes, from the topology (auto's rule 6 "
          "keeps hierarchical on 2 nodes only while it is 0 or >= 2); 0.0 when not known (no topology, one "
          "node, or every rank on its own node).")
      .def_property_readonly(
          "slow_node_factor", [](CommHandle& c) { return c.comm().topology().slow_node_factor; },
          "The median bandwidth across nodes over the slowest node's median (>= 1; auto costs rule 3's "
          "crossover at that node's links); 0.0 when not known (no topology, or fewer than 3 nodes).")
      .def_property_readonly(
          "ring_order", [](CommHandle& c) { return c.comm().topology().ring; },
          "The ring order of algorithm 'ordered_ring' (ring[k] sends to ring[k+1]); [] without a topology.")
      .def_property_readonly(
          "ring_gain", [](CommHandle& c) { return c.comm().topology().ring_gain; },
          "How many times faster the ordered ring's slowest hop is than rank order's (1.0 without a topology).")
      .def_property_readonly("freed", &CommHandle::freed)
      .def_property_readonly(
          "id", [](CommHandle& c) { return c.comm().id(); },
          "Names this communicator alike on every rank (flight-recorder dump files carry it).")
      .def_property_readonly(
          "wait_policy",
          [](CommHandle& c) { return c.comm().wait_policy() == WaitPolicy::kYield ? "yield" : "spin"; },
          "'spin' or 'yield' (ZCOLL_WAIT; auto yields when ranks outnumber this node's cores).")
      .def_property_readonly("_check", [](const CommHandle& c) { return c.check; })
      .def_property(
          "segment_bytes", [](const CommHandle& c) { return c.pipeline.max_segment_bytes; },
          [](CommHandle& c, std::size_t v) { c.pipeline.max_segment_bytes = v; },
          "Largest message of a pipelined algorithm in bytes (0: ZCOLL_SEGMENT_BYTES); small values "
          "reach multi-segment code in tests.")
      .def_property(
          "pipeline_depth", [](const CommHandle& c) { return c.pipeline.depth; },
          [](CommHandle& c, int v) { c.pipeline.depth = v; },
          "Receives posted ahead (0: ZCOLL_PIPELINE_DEPTH).")
      .def_property(
          "timeout", [](CommHandle& c) { return c.comm().watchdog().timeout(); },
          [](CommHandle& c, py::object seconds) {
            c.comm().watchdog().set_timeout(seconds.is_none() ? 0.0 : seconds.cast<double>());
          },
          "Seconds a collective may wait for other ranks before every rank raises zcoll.TimeoutError "
          "(0 or None: never). Default: ZCOLL_TIMEOUT (600).")
      .def_property_readonly(
          "broken", [](CommHandle& c) { return !c.freed() && c.comm().watchdog().broken(); },
          "True once a TimeoutError broke this communicator (every later call raises BrokenError).")
      .def_property_readonly(
          "_last_failure",
          [](CommHandle& c) -> py::object {
            if (c.freed()) return py::none();
            const std::optional<LastFailure> f = c.comm().watchdog().last_failure();
            if (!f) return py::none();
            py::dict d;
            d["missing"] = f->info.missing;
            d["lost"] = f->info.lost;
            d["alive"] = f->alive;
            d["seq"] = f->info.seq;
            d["collective"] = f->info.collective;
            return std::move(d);
          },
          "None, or what the failure that broke this communicator told its caller: {missing, lost, alive, seq, "
          "collective}; alive: the missing ranks whose process this rank saw on this machine, stopped or running "
          "(None once freed, and after leave or a shrink's retirement, which are no failure of this rank).")
      .def(
          "abort",
          [](CommHandle& c, const std::string& reason) { c.comm().watchdog().request_abort(reason); },
          py::arg("reason") = "aborted by the caller",
          "Makes the running collective of this communicator (or its next one) fail on every rank with "
          "zcoll.TimeoutError naming `reason`; safe from any thread. The communicator is broken afterwards.")
      .def(
          "_leave", [](CommHandle& c, const std::string& why) { if (!c.freed()) c.comm().watchdog().leave(why); },
          py::arg("why"),
          "At exit with an uncaught exception (zcoll.core.communicator): tells the other ranks that this rank "
          "makes no more calls, so that their waits raise RankLostError naming it at once; the communicator "
          "is broken here afterwards (free() releases nothing through MPI). Does not block.")
      .def("free", &CommHandle::free, py::call_guard<py::gil_scoped_release>(),
           "Releases the MPI communicator (collective: every rank must call it). Idempotent.")
      .def(
          "stats",
          [](CommHandle& c) {
            const CommStats& s = c.comm().stats();
            py::dict d;
            d["bytes_sent"] = s.bytes_sent;
            d["messages_sent"] = s.messages_sent;
            d["collectives"] = s.collectives;
            d["bytes_read_from_peers"] = s.bytes_read_from_peers;
            d["bytes_written_to_peers"] = s.bytes_written_to_peers;
            return d;
          },
          "Bytes and messages this rank sent through zcoll, the number of collectives, and the bytes it "
          "read straight from other ranks' memory (the shm algorithm's single copy).")
      .def("reset_stats", [](CommHandle& c) { c.comm().stats() = CommStats{}; });
  m.def(
      "best_ring_order",
      [](const std::vector<std::vector<double>>& bandwidth) {
        return best_ring_order(flatten(bandwidth), static_cast<int>(bandwidth.size()));
      },
      py::arg("bandwidth"),
      "The ring order (from rank 0) whose slowest hop is fastest, then whose summed hop time is smallest, "
      "for a p x p matrix of bytes/s (row sends to column; the diagonal is ignored): csrc/comm/topology.h.");
  cls.def_property(
         "telemetry", [](CommHandle& c) { return c.comm().telemetry().enabled(); },
         [](CommHandle& c, bool on) { c.comm().telemetry().set_enabled(on); },
         "Whether messages and collectives are timed for link_stats() (default ZCOLL_TELEMETRY, on).")
      .def(
          "_link_stats_rows",
          [](CommHandle& c, bool reset) {
            MpiCommunicator& comm = c.comm();
            std::vector<std::int64_t> rows;
            {
              py::gil_scoped_release release;
              rows = gather_link_stats(comm, reset);
            }
            const auto p = static_cast<py::ssize_t>(comm.size());
            py::array_t<std::int64_t> out({p, static_cast<py::ssize_t>(link_stats_row_length(comm.size()))});
            std::copy(rows.begin(), rows.end(), out.mutable_data());
            return out;
          },
          py::arg("reset") = false,
          "Collective: every rank's raw telemetry row (collectives/link_stats.h); see link_stats().")
      .def(
          "_call_stats",
          [](CommHandle& c) {
            py::list out;
            c.comm().telemetry().calls().each([&](const char* collective, const char* algorithm, int size_class,
                                                  std::int64_t calls, std::int64_t bytes, std::int64_t sum_ns,
                                                  const std::int64_t* buckets) {
              out.append(py::make_tuple(collective, algorithm, size_class, calls, bytes, sum_ns,
                                        std::vector<std::int64_t>(buckets, buckets + CallStats::kBuckets)));
            });
            return out;
          },
          "Not collective, safe while another thread runs a call: this rank's calls since creation per "
          "(collective, algorithm, size class), each (collective, algorithm, size_class, calls, bytes, sum_ns, "
          "buckets): comm/call_stats.h (zcoll.observe.metrics reads it).");
  cls.def(
      "dump", [](CommHandle& c, const std::string& reason) { return dump_communicator(c.comm(), reason); },
      py::arg("reason") = "zcoll.Communicator.dump()",
      "Writes this communicator's flight recorder to a JSON file; returns its path ('' when the recorder is off).");
  m.def("dump_all", &dump_all, py::arg("reason") = "zcoll.dump()", py::call_guard<py::gil_scoped_release>(),
        "Writes the flight recorder of every live communicator of this process; returns the paths.");
  m.def("dump_directory", &dump_directory, "Where flight-recorder dumps go (ZCOLL_DUMP_DIR).");
  m.def("exit_if_stuck", &exit_if_stuck, py::arg("seconds"), py::arg("status"), py::arg("cap_seconds"),
        "Ends the process with `status` (without MPI_Finalize) if it has not ended by itself within "
        "`seconds` and a peer of one of its MPI communicators on this machine is gone or stopped (or a peer "
        "is on another machine, where only the timer can tell), and in any case after `cap_seconds` "
        "(a C++ thread, alive while Python finalizes): comm/watchdog.h.");
  m.def("broken_count", &Watchdog::broken_count,
        "Communicators of this process that a failure (zcoll.TimeoutError) broke so far.");
  m.def("mpi_initialized", [] {
    int flag = 0;
    MPI_Initialized(&flag);
    return bool(flag);
  });
  m.def("mpi_library_version", [] {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    return std::string(v, len);
  });
  return cls;
}

}  // namespace zcoll::bindings
