// zcoll._C: the private extension. The public API is python/zcoll. Arrays, enums and options
// cross this boundary as the caller's own objects and are taken and checked here in C++
// (buffers.h, enums.h); the collectives release the GIL when they can block (bindings.h).
#include "bindings.h"
#include "bindings/fast_method.h"
#include "common/error.h"
#include "config.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "zcoll private extension (use the zcoll package)";
  m.attr("__version__") = ZCOLL_VERSION;
  m.attr("with_cuda") = bool(ZCOLL_WITH_CUDA);
  zcoll::bindings::register_exceptions(m);
  zcoll::bindings::bind_enums(m);
  auto comm = zcoll::bindings::bind_comm(m);
  zcoll::bindings::bind_collectives(m, comm);
  zcoll::bindings::bind_kernels(m);
  zcoll::bindings::bind_compression(m);
  zcoll::bindings::bind_compressed(m);
  zcoll::bindings::bind_env(m);
  zcoll::bindings::bind_shrink(m, comm);
}
