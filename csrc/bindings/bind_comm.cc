// The communicator: built from an MPI Fortran handle (mpi4py's Comm.py2f()), which every MPI
// implementation converts back with MPI_Comm_f2c, whatever its C handle type.
#include <mpi.h>

#include <memory>

#include "bindings.h"
#include "comm/mpi_communicator.h"

namespace py = pybind11;

namespace zcoll::bindings {

void bind_comm(py::module_& m) {
  py::class_<MpiCommunicator, std::shared_ptr<MpiCommunicator>>(m, "Comm")
      .def(py::init([](long long fortran_handle) {
             return std::make_shared<MpiCommunicator>(MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle)));
           }),
           py::arg("fortran_handle"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("rank", &MpiCommunicator::rank)
      .def_property_readonly("size", &MpiCommunicator::size)
      .def_property_readonly("local_size", &MpiCommunicator::local_size)
      .def_property_readonly("wait_policy",
                             [](const MpiCommunicator& c) { return c.wait_policy() == WaitPolicy::kYield ? "yield" : "spin"; })
      .def("free", &MpiCommunicator::free)
      .def("stats",
           [](MpiCommunicator& c) {
             py::dict d;
             d["bytes_sent"] = c.stats().bytes_sent;
             d["messages_sent"] = c.stats().messages_sent;
             d["collectives"] = c.stats().collectives;
             return d;
           })
      .def("reset_stats", [](MpiCommunicator& c) { c.stats() = CommStats{}; });
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
}

}  // namespace zcoll::bindings
