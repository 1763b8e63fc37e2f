// Compression kernels (kernels/quantize.h, kernels/sparsify.h) on raw addresses, for the Python
// compressors, tests and benchmarks. Python checks buffer sizes and dtypes; C++ checks the
// parameters (ValueError). Every call releases the GIL. `impl` ("dispatch", "scalar", "avx2" or
// "avx512"; default "dispatch") picks the kernel table, parsed by kernels::parse_kernel_impl as
// in bind_kernels.cc; topk_threshold and randomk have no table (a sample, a bitmap), so no impl.
// Quantizing calls return (nonfinite_blocks, first_nonfinite_block or -1): the caller raises
// FloatingPointError naming the tensor when the first is not 0.
#include <cstdint>
#include <string>
#include <tuple>

#include "bindings.h"
#include "common/check.h"
#include "common/rng.h"
#include "kernels/quantize.h"
#include "kernels/sparsify.h"

namespace py = pybind11;

namespace zcoll::bindings {
namespace {
using namespace zcoll::kernels;

template <typename T = void>
T* ptr(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

Rounding parse_rounding(const std::string& s) {
  if (s == "nearest") return Rounding::kNearest;
  if (s == "stochastic") return Rounding::kStochastic;
  throw std::invalid_argument("rounding must be 'nearest' or 'stochastic', not '" + s + "'");
}

TopkMethod parse_method(const std::string& s) {
  if (s == "sampled") return TopkMethod::kSampled;
  if (s == "exact") return TopkMethod::kExact;
  throw std::invalid_argument("top-k method must be 'sampled' or 'exact', not '" + s + "'");
}

QuantParams params(int bits, std::size_t block, const std::string& rounding, std::uint64_t seed,
                   std::uint64_t offset) {
  return QuantParams{bits, block, parse_rounding(rounding), seed, offset};
}

std::tuple<std::size_t, long long> status(const QuantStatus& s) {
  return {s.nonfinite_blocks, s.ok() ? -1LL : static_cast<long long>(s.first_nonfinite_block)};
}

}  // namespace

void bind_compression(py::module_& m) {
  auto release = py::call_guard<py::gil_scoped_release>();
  // ---- layout helpers ----
  m.def("num_blocks", &num_blocks, py::arg("n"), py::arg("block"));
  m.def("code_bytes", &code_bytes, py::arg("n"), py::arg("bits"));
  m.def(
      "quant_layout",
      [](std::size_t n, int bits, std::size_t block) {
        const QuantLayout l = quant_layout(n, QuantParams{bits, block});
        return std::make_tuple(l.blocks, l.code_bytes, l.scales_offset, l.total_bytes);
      },
      py::arg("n"), py::arg("bits"), py::arg("block") = 256);
  // ---- quantizers ----
  m.def(
      "quantize",
      [](std::uintptr_t x, int dtype, std::size_t n, std::uintptr_t codes, std::uintptr_t scales, int bits,
         std::size_t block, const std::string& rounding, std::uint64_t seed, std::uint64_t offset,
         const std::string& impl) {
        return status(quantize(ptr(x), static_cast<DType>(dtype), n,
                               params(bits, block, rounding, seed, offset), ptr<std::uint8_t>(codes),
                               ptr<float>(scales), parse_kernel_impl(impl)));
      },
      py::arg("x"), py::arg("dtype"), py::arg("n"), py::arg("codes"), py::arg("scales"), py::arg("bits") = 8,
      py::arg("block") = 256, py::arg("rounding") = "nearest", py::arg("seed") = 0, py::arg("offset") = 0,
      py::arg("impl") = "dispatch", release);
  m.def(
      "dequantize",
      [](std::uintptr_t codes, std::uintptr_t scales, std::size_t n, std::uintptr_t y, int bits,
         std::size_t block, bool accumulate, const std::string& impl) {
        const QuantParams p{bits, block};
        if (accumulate)
          dequantize_add(ptr<const std::uint8_t>(codes), ptr<const float>(scales), n, p, ptr<float>(y),
                         parse_kernel_impl(impl));
        else
          dequantize(ptr<const std::uint8_t>(codes), ptr<const float>(scales), n, p, ptr<float>(y),
                     parse_kernel_impl(impl));
      },
      py::arg("codes"), py::arg("scales"), py::arg("n"), py::arg("y"), py::arg("bits") = 8,
      py::arg("block") = 256, py::arg("accumulate") = false, py::arg("impl") = "dispatch", release);
  m.def(
      "dequantize_add_quantize",
      [](std::uintptr_t codes_in, std::uintptr_t scales_in, std::uintptr_t x, int dtype, std::size_t n,
         std::uintptr_t codes_out, std::uintptr_t scales_out, std::uintptr_t sum_out, int bits,
         std::size_t block, const std::string& rounding, std::uint64_t seed, std::uint64_t offset,
         const std::string& impl) {
        return status(dequantize_add_quantize(
            ptr<const std::uint8_t>(codes_in), ptr<const float>(scales_in), ptr(x), static_cast<DType>(dtype),
            n, params(bits, block, rounding, seed, offset), ptr<std::uint8_t>(codes_out),
            ptr<float>(scales_out), ptr<float>(sum_out), parse_kernel_impl(impl)));
      },
      py::arg("codes_in"), py::arg("scales_in"), py::arg("x"), py::arg("dtype"), py::arg("n"),
      py::arg("codes_out"), py::arg("scales_out"), py::arg("sum_out") = 0, py::arg("bits") = 8,
      py::arg("block") = 256, py::arg("rounding") = "nearest", py::arg("seed") = 0, py::arg("offset") = 0,
      py::arg("impl") = "dispatch", release);
  m.def(
      "quantize_ef",
      [](std::uintptr_t g, int dtype, std::uintptr_t e, std::size_t n, std::uintptr_t codes,
         std::uintptr_t scales, int bits, std::size_t block, const std::string& rounding, std::uint64_t seed,
         std::uint64_t offset, const std::string& impl) {
        return status(quantize_ef(ptr(g), static_cast<DType>(dtype), ptr<float>(e), n,
                                  params(bits, block, rounding, seed, offset), ptr<std::uint8_t>(codes),
                                  ptr<float>(scales), parse_kernel_impl(impl)));
      },
      py::arg("g"), py::arg("dtype"), py::arg("e"), py::arg("n"), py::arg("codes"), py::arg("scales"),
      py::arg("bits") = 8, py::arg("block") = 256, py::arg("rounding") = "nearest", py::arg("seed") = 0,
      py::arg("offset") = 0, py::arg("impl") = "dispatch", release);
  m.def(
      "cast",
      [](std::uintptr_t x, int from, std::uintptr_t y, int to, std::size_t n, const std::string& impl) {
        cast(ptr(x), static_cast<DType>(from), ptr(y), static_cast<DType>(to), n, parse_kernel_impl(impl));
      },
      py::arg("x"), py::arg("from_dtype"), py::arg("y"), py::arg("to_dtype"), py::arg("n"),
      py::arg("impl") = "dispatch", release);
  // ---- sparsifiers ----
  m.def(
      "topk",
      [](std::uintptr_t x, std::size_t n, std::size_t k, std::uintptr_t idx, std::uintptr_t val,
         const std::string& method, std::uint64_t seed, const std::string& impl, std::size_t sample) {
        topk(ptr<const float>(x), n, k, ptr<std::uint32_t>(idx), ptr<float>(val), parse_method(method), seed,
             parse_kernel_impl(impl), sample);
      },
      py::arg("x"), py::arg("n"), py::arg("k"), py::arg("idx"), py::arg("val"), py::arg("method") = "sampled",
      py::arg("seed") = 0, py::arg("impl") = "dispatch", py::arg("sample") = 0, release);
  m.def(
      "topk_ef",
      [](std::uintptr_t g, std::uintptr_t e, std::size_t n, std::size_t k, std::uintptr_t idx,
         std::uintptr_t val, const std::string& method, std::uint64_t seed, const std::string& impl,
         std::size_t sample) {
        topk_ef(ptr<const float>(g), ptr<float>(e), n, k, ptr<std::uint32_t>(idx), ptr<float>(val),
                parse_method(method), seed, parse_kernel_impl(impl), sample);
      },
      py::arg("g"), py::arg("e"), py::arg("n"), py::arg("k"), py::arg("idx"), py::arg("val"),
      py::arg("method") = "sampled", py::arg("seed") = 0, py::arg("impl") = "dispatch", py::arg("sample") = 0,
      release);
  // A compressor's per-call seed (codecs.py): 0.2 us here against 1.6 us of Python integers.
  m.def(
      "call_seed",
      [](std::uint64_t seed, std::uint64_t key_hash, std::uint64_t call) {
        return chain_seed(chain_seed(chain_seed(0, seed), key_hash), call);
      },
      py::arg("seed"), py::arg("key_hash"), py::arg("call"));
  // The sample a segment of n elements of a tensor of `total` takes in the public top-k path.
  m.def("topk_sample_share", &topk_sample_share, py::arg("total"), py::arg("n"));
  m.def(
      "topk_threshold",
      [](std::uintptr_t x, std::size_t n, std::size_t k, std::uint64_t seed) {
        return topk_threshold(ptr<const float>(x), n, k, seed);
      },
      py::arg("x"), py::arg("n"), py::arg("k"), py::arg("seed") = 0, release);
  m.def(
      "threshold",
      [](std::uintptr_t x, std::size_t n, float t, std::uintptr_t idx, std::uintptr_t val,
         std::size_t capacity, const std::string& impl) {
        return threshold(ptr<const float>(x), n, t, ptr<std::uint32_t>(idx), ptr<float>(val), capacity,
                         parse_kernel_impl(impl));
      },
      py::arg("x"), py::arg("n"), py::arg("t"), py::arg("idx"), py::arg("val"), py::arg("capacity"),
      py::arg("impl") = "dispatch", release);
  m.def(
      "randomk",
      [](std::uintptr_t x, std::size_t n, std::size_t k, std::uint64_t seed, std::uintptr_t idx,
         std::uintptr_t val) {
        randomk(ptr<const float>(x), n, k, seed, ptr<std::uint32_t>(idx), ptr<float>(val));
      },
      py::arg("x"), py::arg("n"), py::arg("k"), py::arg("seed"), py::arg("idx"), py::arg("val"), release);
  m.def(
      "scatter_add",
      [](std::uintptr_t y, std::size_t n, std::uintptr_t idx, std::uintptr_t val, std::size_t m,
         const std::string& impl) {
        scatter_add(ptr<float>(y), n, ptr<const std::uint32_t>(idx), ptr<const float>(val), m,
                    parse_kernel_impl(impl));
      },
      py::arg("y"), py::arg("n"), py::arg("idx"), py::arg("val"), py::arg("m"), py::arg("impl") = "dispatch",
      release);
}

}  // namespace zcoll::bindings
