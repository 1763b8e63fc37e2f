// zcoll._C.Comm: built from an MPI Fortran handle (mpi4py's Comm.py2f()), which every MPI
// implementation converts back with MPI_Comm_f2c, whatever its C handle type. Lifetime follows
// mpi4py: free() is the collective release (GIL released, MPI errors raise ZcollError); an
// unfreed communicator that is garbage-collected only warns (ResourceWarning) and leaks its MPI
// communicator, since collection happens in a different order on every rank. Python's atexit
// handler (communicator.py) frees the live ones before MPI_Finalize.
#include <mpi.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "bindings/enums.h"
#include "comm/topology.h"
#include "common/check.h"

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
      .def_property_readonly("node_count", [](CommHandle& c) { return c.comm().node_count(); },
                             "Nodes the ranks are on.")
      .def("node_of", [](CommHandle& c, int rank) { return c.comm().node_of(rank); }, py::arg("rank"),
           "The node of `rank`, 0..node_count-1, numbered in order of each node's lowest rank.")
      .def_property_readonly("local_ranks", [](CommHandle& c) { return c.comm().local_ranks(); },
                             "The ranks on this rank's node, ascending.")
      .def(
          "_set_topology",
          [](CommHandle& c, const std::vector<std::vector<double>>& bandwidth) {
            c.comm().set_topology(bandwidth.empty() ? Topology{} : topology_from_bandwidth(flatten(bandwidth), c.comm().size()));
          },
          py::arg("bandwidth"),
          "Sets the link bandwidths (a size x size matrix of bytes/s, row sends to column; [] clears).")
      .def_property_readonly(
          "ring_order", [](CommHandle& c) { return c.comm().topology().ring; },
          "The ring order of algorithm 'ordered_ring' (ring[k] sends to ring[k+1]); [] without a topology.")
      .def_property_readonly(
          "ring_gain", [](CommHandle& c) { return c.comm().topology().ring_gain; },
          "How many times faster the ordered ring's slowest hop is than rank order's (1.0 without a topology).")
      .def_property_readonly("freed", &CommHandle::freed)
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
            return d;
          },
          "Bytes and messages this rank sent through zcoll, and the number of collectives.")
      .def("reset_stats", [](CommHandle& c) { c.comm().stats() = CommStats{}; });
  m.def(
      "best_ring_order",
      [](const std::vector<std::vector<double>>& bandwidth) {
        return best_ring_order(flatten(bandwidth), static_cast<int>(bandwidth.size()));
      },
      py::arg("bandwidth"),
      "The ring order (from rank 0) whose slowest hop is fastest, then whose summed hop time is smallest, "
      "for a p x p matrix of bytes/s (row sends to column; the diagonal is ignored): csrc/comm/topology.h.");
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
