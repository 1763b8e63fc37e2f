// One bind_* function per area, called from module.cc.
#pragma once
#include <pybind11/pybind11.h>

namespace zcoll::bindings {
void bind_comm(pybind11::module_& m);
void bind_collectives(pybind11::module_& m);
void bind_kernels(pybind11::module_& m);
void bind_compression(pybind11::module_& m);
void bind_compressed(pybind11::module_& m);
void bind_env(pybind11::module_& m);
}  // namespace zcoll::bindings
