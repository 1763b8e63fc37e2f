// zcoll._C: the private extension. The public API is python/zcoll; this module takes raw
// addresses and dtype/op codes that the Python layer has already validated, and releases the
// GIL around every call that can block.
#include "bindings.h"
#include "common/error.h"
#include "config.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "zcoll private extension (use the zcoll package)";
  m.attr("__version__") = ZCOLL_VERSION;
  m.attr("with_cuda") = bool(ZCOLL_WITH_CUDA);
  pybind11::register_exception<zcoll::Error>(m, "ZcollError", PyExc_RuntimeError);
  pybind11::register_exception<zcoll::MismatchError>(m, "MismatchError", PyExc_ValueError);
  zcoll::bindings::bind_comm(m);
  zcoll::bindings::bind_collectives(m);
  zcoll::bindings::bind_kernels(m);
  zcoll::bindings::bind_compression(m);
  zcoll::bindings::bind_compressed(m);
  zcoll::bindings::bind_env(m);
}
