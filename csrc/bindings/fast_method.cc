#include "bindings/fast_method.h"

#include <new>
#include <stdexcept>

#include "common/error.h"

namespace py = pybind11;

namespace zcoll::bindings {
namespace {
PyObject* g_zcoll_error = PyExc_RuntimeError;
PyObject* g_mismatch_error = PyExc_ValueError;
}  // namespace

void set_exception_types(PyObject* zcoll_error, PyObject* mismatch_error) {
  g_zcoll_error = zcoll_error;
  g_mismatch_error = mismatch_error;
}

void set_python_error() noexcept {
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
