#include "bindings/fast_method.h"

#include <pybind11/stl.h>

#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "common/error.h"

namespace py = pybind11;

namespace zcoll::bindings {
namespace {
PyObject* g_zcoll_error = PyExc_RuntimeError;
PyObject* g_mismatch_error = PyExc_ValueError;
PyObject* g_timeout_error = PyExc_TimeoutError;
PyObject* g_rank_lost_error = PyExc_TimeoutError;
PyObject* g_broken_error = PyExc_RuntimeError;

// A new exception type zcoll._C.<name> with these bases, added to the module.
PyObject* new_exception(py::module_& m, const char* name, py::tuple bases, const char* doc) {
  const std::string qualified = std::string("zcoll._C.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (!type) throw py::error_already_set();
  m.add_object(name, py::handle(type));  // the module keeps the reference
  return type;
}

// A TimeoutError (or RankLostError) instance carrying what the C++ exception knows.
void set_failure(PyObject* type, const TimeoutError& e) {
  const FailureInfo& info = e.info();
  try {
    py::object error = py::reinterpret_borrow<py::object>(type)(e.what());
    error.attr("collective") = info.collective.empty() ? py::object(py::none()) : py::str(info.collective);
    error.attr("seq") = info.seq;
    error.attr("nbytes") = info.bytes;
    error.attr("missing") = py::tuple(py::cast(info.missing));
    error.attr("lost") = py::tuple(py::cast(info.lost));
    error.attr("dump_path") = info.dump_path.empty() ? py::object(py::none()) : py::str(info.dump_path);
    PyErr_SetObject(type, error.ptr());
  } catch (py::error_already_set& inner) {
    inner.restore();
  }
}

// The failure exceptions as their Python types (true), or false for any other exception.
bool translate_failure(const std::exception_ptr& p) noexcept {
  try {
    std::rethrow_exception(p);
  } catch (const RankLostError& e) {  // before TimeoutError, which it derives from
    set_failure(g_rank_lost_error, e);
  } catch (const TimeoutError& e) {
    set_failure(g_timeout_error, e);
  } catch (const BrokenError& e) {
    PyErr_SetString(g_broken_error, e.what());
  } catch (...) {
    return false;
  }
  return true;
}
}  // namespace

void register_exceptions(py::module_& m) {
  auto& zcoll_error = py::register_exception<Error>(m, "ZcollError", PyExc_RuntimeError);
  auto& mismatch = py::register_exception<MismatchError>(m, "MismatchError", PyExc_ValueError);
  g_zcoll_error = zcoll_error.ptr();
  g_mismatch_error = mismatch.ptr();
  g_timeout_error = new_exception(
      m, "TimeoutError", py::make_tuple(zcoll_error, py::handle(PyExc_TimeoutError)),
      "A collective could not complete because of other ranks: its deadline passed (timeout=, ZCOLL_TIMEOUT), a "
      "peer announced its own failure, or the call was aborted. Raised on every surviving rank. Attributes: "
      "collective, seq (the call's number, the same on every rank), nbytes, missing (ranks never heard from), "
      "lost (of those, ranks whose process is gone), dump_path (this rank's flight-recorder dump or None). The "
      "communicator is broken afterwards: later calls raise BrokenError.");
  g_rank_lost_error = new_exception(
      m, "RankLostError", py::make_tuple(py::handle(g_timeout_error)),
      "A TimeoutError raised without waiting for the deadline: a peer's process is gone (see .lost).");
  g_broken_error = new_exception(m, "BrokenError", py::make_tuple(zcoll_error),
                                 "A call on a communicator that an earlier TimeoutError broke: create a new one.");
  py::handle timeout_type(g_timeout_error);
  timeout_type.attr("collective") = py::none();
  timeout_type.attr("seq") = py::none();
  timeout_type.attr("nbytes") = py::none();
  timeout_type.attr("missing") = py::tuple();
  timeout_type.attr("lost") = py::tuple();
  timeout_type.attr("dump_path") = py::none();
  // pybind11-bound functions: the same mapping as the fast methods (tried before ZcollError's).
  py::register_exception_translator([](std::exception_ptr p) {
    if (p && !translate_failure(p)) std::rethrow_exception(p);
  });
}

void set_python_error() noexcept {
  if (translate_failure(std::current_exception())) return;
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (const MismatchError& e) {
    PyErr_SetString(g_mismatch_error, e.what());
  } catch (const Error& e) {
    PyErr_SetString(g_zcoll_error, e.what());
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
}

void add_method(py::class_<CommHandle>& cls, PyMethodDef* def) {
  PyObject* descr = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), def);
  if (!descr) throw py::error_already_set();
  const int rc = PyObject_SetAttrString(cls.ptr(), def->ml_name, descr);
  Py_DECREF(descr);
  if (rc != 0) throw py::error_already_set();
}

}  // namespace zcoll::bindings
