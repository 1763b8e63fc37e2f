// zcoll._C.Comm's in-place recovery (comm/fault_tolerance.h): a second constructor,
// Comm(survivors_of), collective over the surviving ranks of `survivors_of`, which builds the
// survivors' communicator with the parent's options, and what that shrink found.
#include <pybind11/stl.h>

#include "bindings.h"
#include "comm/fault_tolerance.h"

namespace py = pybind11;

namespace zcoll::bindings {

CommHandle::CommHandle(std::unique_ptr<MpiCommunicator> comm, const CommHandle& parent)
    : pipeline(parent.pipeline), check(parent.check), comm_(std::move(comm)) {}

void bind_shrink(py::module_& m, py::class_<CommHandle>& cls) {
  cls.def(py::init([](CommHandle& parent) {
            MpiCommunicator& old = parent.comm();
            Shrunk shrunk;
            {
              py::gil_scoped_release release;  // collective over the survivors
              shrunk = shrink_communicator(old);
            }
            auto handle = std::make_unique<CommHandle>(std::move(shrunk.comm), parent);
            handle->shrunk_from = {shrunk.kept, shrunk.lost, old.size(), shrunk.seconds};
            return handle;
          }),
          py::arg("survivors_of"),
          "The survivors of `survivors_of` (collective over its live ranks): zcoll.Communicator.shrink().")
      .def_property_readonly(
          "_shrunk_from",
          [](const CommHandle& c) -> py::object {
            const ShrinkReport& s = c.shrunk_from;
            if (s.parent_size == 0) return py::none();
            py::dict d;
            d["kept"] = s.kept;
            d["lost"] = s.lost;
            d["parent_size"] = s.parent_size;
            d["seconds"] = s.seconds;
            return d;
          },
          "What the shrink that made this communicator found (None if none did).")
      .def(
          "_retire",
          [](CommHandle& c, const std::string& why) {
            if (!c.freed()) c.comm().watchdog().retire(why);
          },
          py::arg("why"),
          "This communicator was replaced (torch's shrink_group): broken from now on, and free() releases "
          "nothing through MPI. Not collective.");
  m.def("shrink_unavailable_reason", &shrink_unavailable_reason,
        "'' when zcoll.Communicator.shrink() can work in this build and job; else why not and what to "
        "install.");
}

}  // namespace zcoll::bindings
