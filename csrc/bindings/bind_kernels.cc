// The reduction kernels (kernels/reduce.h) on raw addresses, for tests and benchmarks, and the
// instruction-set queries. `impl` is "dispatch", "scalar", "avx2" or "avx512", parsed by
// kernels::parse_kernel_impl like every other kernel binding (bind_compression.cc); an ISA this
// CPU lacks raises ValueError. kernel_impls() lists what this CPU runs, "scalar" first.
#include <cstdint>
#include <string>

#include "bindings.h"
#include "common/check.h"
#include "kernels/reduce.h"
#include "kernels/simd_level.h"

namespace py = pybind11;

namespace zcoll::bindings {

void bind_kernels(py::module_& m) {
  using namespace zcoll::kernels;
  auto release = py::call_guard<py::gil_scoped_release>();
  m.def(
      "reduce_kernel",
      [](std::uintptr_t out, std::uintptr_t a, std::uintptr_t b, std::size_t count, int dtype, int op,
         const std::string& impl) {
        const DType d = static_cast<DType>(dtype);
        const ReduceOp r = static_cast<ReduceOp>(op);
        // Unknown dtype/op codes would otherwise run the int64 loop (past the buffers) or nothing.
        dtype_size(d);
        validate_op(d, r);
        reduce(reinterpret_cast<void*>(out), reinterpret_cast<const void*>(a),
               reinterpret_cast<const void*>(b), count, d, r, parse_kernel_impl(impl));
      },
      py::arg("out"), py::arg("a"), py::arg("b"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("impl") = "dispatch", release);
  m.def(
      "divide_kernel",
      [](std::uintptr_t buf, std::size_t count, int dtype, int divisor, const std::string& impl) {
        const DType d = static_cast<DType>(dtype);
        dtype_size(d);  // throws for an unknown dtype code
        ZCOLL_REQUIRE(divisor > 0, "divisor must be positive, got ", divisor);
        divide(reinterpret_cast<void*>(buf), count, d, divisor, parse_kernel_impl(impl));
      },
      py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("divisor"), py::arg("impl") = "dispatch",
      release);
  m.def("simd_level", [] { return std::string(simd_level_name(simd_level())); });
  m.def("detected_simd_level", [] { return std::string(simd_level_name(detected_simd_level())); });
  m.def("kernel_impls", [] {
    py::list names;
    for (KernelImpl impl : supported_kernel_impls()) names.append(kernel_impl_name(impl));
    return names;
  });
}

}  // namespace zcoll::bindings
