// Methods of zcoll._C.Comm that every collective call goes through, registered as plain
// METH_FASTCALL methods rather than through pybind11's dispatcher. Measured on a 4-argument
// method of a pybind11 class (py::handle arguments, no work): ~170 ns a call through pybind11
// (overload resolution, argument loaders, a function_call record), ~50 ns as a fastcall
// method. Exceptions become the Python exceptions pybind11 would raise for them.
#pragma once
#include <pybind11/pybind11.h>

#include "bindings.h"

namespace zcoll::bindings {

// Sets the Python error for the C++ exception being handled: TimeoutError / RankLostError (with
// their attributes), BrokenError, ZcollError, MismatchError, ValueError (std::invalid_argument),
// pybind11's own exceptions, MemoryError, RuntimeError.
void set_python_error() noexcept;
// zcoll's exception types, created and registered once by module.cc (register_exceptions).
void register_exceptions(pybind11::module_& m);

// fastcall<Fn, N>: a METH_FASTCALL method taking exactly N positional arguments that calls
// Fn(the CommHandle of self, args) and returns None.
using CommMethod = void (*)(CommHandle&, PyObject* const* args);

template <CommMethod Fn, int N>
PyObject* fastcall(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != N) {
    PyErr_Format(PyExc_TypeError, "expected %d positional arguments, got %zd", N, nargs);
    return nullptr;
  }
  try {
    Fn(pybind11::cast<CommHandle&>(pybind11::handle(self)), args);
  } catch (...) {
    set_python_error();
    return nullptr;
  }
  Py_RETURN_NONE;
}

// Adds the method `def` (static storage: Python keeps a pointer to it) to cls.
void add_method(pybind11::class_<CommHandle>& cls, PyMethodDef* def);

}  // namespace zcoll::bindings
