// Kernels for tests and benchmarks: the dispatched version and each ISA copy by name.
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
  m.def(
      "reduce_kernel",
      [](std::uintptr_t out, std::uintptr_t a, std::uintptr_t b, std::size_t count, int dtype, int op,
         const std::string& impl) {
        auto* o = reinterpret_cast<void*>(out);
        auto* x = reinterpret_cast<const void*>(a);
        auto* y = reinterpret_cast<const void*>(b);
        const DType d = static_cast<DType>(dtype);
        const ReduceOp r = static_cast<ReduceOp>(op);
        // Unknown dtype/op codes would otherwise run the int64 loop (past the buffers) or nothing.
        dtype_size(d);
        validate_op(d, r);
        if (impl == "dispatch") return reduce(o, x, y, count, d, r);
        if (impl == "scalar") return scalar::reduce(o, x, y, count, d, r);
        const SimdLevel cpu = detected_simd_level();
        if (impl == "avx2" && cpu >= SimdLevel::kAvx2) return avx2::reduce(o, x, y, count, d, r);
        if (impl == "avx512" && cpu >= SimdLevel::kAvx512) return avx512::reduce(o, x, y, count, d, r);
        throw std::invalid_argument("kernel implementation '" + impl + "' is unknown or not supported by this CPU");
      },
      py::arg("out"), py::arg("a"), py::arg("b"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("impl") = "dispatch", py::call_guard<py::gil_scoped_release>());
  m.def(
      "divide_kernel",
      [](std::uintptr_t buf, std::size_t count, int dtype, int divisor, const std::string& impl) {
        auto* b = reinterpret_cast<void*>(buf);
        const DType d = static_cast<DType>(dtype);
        dtype_size(d);  // throws for an unknown dtype code
        ZCOLL_REQUIRE(divisor > 0, "divisor must be positive, got ", divisor);
        if (impl == "scalar") return scalar::divide(b, count, d, divisor);
        return divide(b, count, d, divisor);
      },
      py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("divisor"), py::arg("impl") = "dispatch");
  m.def("simd_level", [] { return std::string(simd_level_name(simd_level())); });
  m.def("detected_simd_level", [] { return std::string(simd_level_name(detected_simd_level())); });
  m.def("kernel_impls", [] {
    py::list l;
    l.append("scalar");
    if (detected_simd_level() >= SimdLevel::kAvx2) l.append("avx2");
    if (detected_simd_level() >= SimdLevel::kAvx512) l.append("avx512");
    return l;
  });
}

}  // namespace zcoll::bindings
