// The enums at the boundary (DType, ReduceOp, Algorithm, Compression), bound once with
// py::enum_ under the names C++ gives them, and the one conversion of a Python argument to
// each: the name as a str ("sum", "ring", ...) or the enum itself. An unknown name is a
// ValueError listing the valid ones; anything else a TypeError. No integer codes cross.
#pragma once
#include <pybind11/pybind11.h>

#include "collectives/compression.h"
#include "collectives/options.h"
#include "common/dtype.h"

namespace zcoll::bindings {

ReduceOp to_op(pybind11::handle h);
Algorithm to_algorithm(pybind11::handle h);
Compression to_compression(pybind11::handle h);
DType to_dtype(pybind11::handle h);

void bind_enums(pybind11::module_& m);

}  // namespace zcoll::bindings
