// zcoll_cuda_check: the CUDA kernels against the CPU scalar reference, bit for bit, on a machine
// with a GPU (built with -DZCOLL_ENABLE_CUDA=ON; run build/<dir>/csrc/cuda/zcoll_cuda_check).
//
// Checks, for sizes 1 .. 2^24, float32 / float16 / bfloat16 inputs, 8 / 4 / 1 bits, nearest and
// stochastic rounding: codes and scales of cuda::quantize equal kernels::quantize (scalar);
// cuda::dequantize (plain and accumulating) equals the scalar dequantize; the non-finite block
// counter; cuda::topk equals kernels::topk (exact). Then times the GPU kernels (GB/s of float32
// input). Exit status: 0 all equal, 1 a mismatch, 77 no CUDA device (skipped).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "cuda/quantize_cuda.h"
#include "cuda/sparsify_cuda.h"
#include "kernels/quantize.h"
#include "kernels/sparsify.h"

namespace {
using namespace zcoll;

int failures = 0;

#define CHECK_CUDA(call)                                                                          \
  do {                                                                                            \
    const cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

template <typename T>
struct Dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t count) : n(count) {
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(1, count) * sizeof(T)));
  }
  ~Dev() { cudaFree(p); }
  void put(const std::vector<T>& v) {
    CHECK_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> get() const {
    std::vector<T> v(n);
    CHECK_CUDA(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

std::vector<float> data(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> mag(-6, 3);
  std::vector<float> x(n);
  for (std::size_t b = 0; b < n; b += 256) {
    const float m = std::pow(10.0f, mag(gen));
    for (std::size_t i = b; i < std::min(n, b + 256); ++i) x[i] = normal(gen) * m;
  }
  if (n > 2000) {  // edge values: zeros, -0, denormals, huge
    for (std::size_t i = 0; i < 256; ++i) x[i] = (i % 2) ? -0.0f : 0.0f;
    for (std::size_t i = 256; i < 512; ++i) x[i] = 1.5e-42f * float(int(i) - 384);
    for (std::size_t i = 512; i < 768; ++i) x[i] = (i % 2) ? 3.4e38f : -3.4e38f;
  }
  return x;
}

// Host copy of x in dtype (raw 16-bit words for the half types).
std::vector<std::uint16_t> narrow(const std::vector<float>& x, DType d) {
  std::vector<std::uint16_t> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    h[i] = d == DType::kFloat16 ? float_to_fp16(x[i]) : float_to_bf16(x[i]);
  return h;
}

void check_quantize(std::size_t n, DType dtype, const kernels::QuantParams& p) {
  const std::string what = "quantize n=" + std::to_string(n) + " dtype=" + dtype_name(dtype) +
                           " bits=" + std::to_string(p.bits) +
                           (p.rounding == kernels::Rounding::kStochastic ? " stochastic" : "");
  const std::vector<float> x = data(n, unsigned(n) + p.bits);
  const std::vector<std::uint16_t> h = narrow(x, dtype);
  const void* host_in = dtype == DType::kFloat32 ? static_cast<const void*>(x.data()) : h.data();
  const std::size_t nb = kernels::num_blocks(n, p.block), cb = kernels::code_bytes(n, p.bits);
  std::vector<std::uint8_t> codes(cb);
  std::vector<float> scales(nb);
  const auto st =
      kernels::quantize(host_in, dtype, n, p, codes.data(), scales.data(), kernels::KernelImpl::kScalar);
  Dev<float> dx(n);
  Dev<std::uint16_t> dh(n);
  Dev<std::uint8_t> dc(cb);
  Dev<float> ds(nb);
  Dev<unsigned> bad(1);
  bad.put({0u});
  if (dtype == DType::kFloat32)
    dx.put(x);
  else
    dh.put(h);
  cuda::quantize(dtype == DType::kFloat32 ? static_cast<const void*>(dx.p) : dh.p, dtype, n, p, dc.p, ds.p,
                 bad.p);
  CHECK_CUDA(cudaDeviceSynchronize());
  expect(same_bytes(dc.get(), codes), what + ": codes");
  expect(same_bytes(ds.get(), scales), what + ": scales");
  expect(bad.get()[0] == st.nonfinite_blocks, what + ": non-finite block count");
  // dequantize and dequantize-accumulate
  std::vector<float> y(n, 0.25f), yacc(n, 0.25f);
  kernels::dequantize(codes.data(), scales.data(), n, p, y.data(), kernels::KernelImpl::kScalar);
  kernels::dequantize_add(codes.data(), scales.data(), n, p, yacc.data(), kernels::KernelImpl::kScalar);
  Dev<float> dy(n);
  dy.put(std::vector<float>(n, 0.25f));
  cuda::dequantize(dc.p, ds.p, n, p, dy.p, true);
  CHECK_CUDA(cudaDeviceSynchronize());
  expect(same_bytes(dy.get(), yacc), what + ": dequantize accumulate");
  cuda::dequantize(dc.p, ds.p, n, p, dy.p, false);
  CHECK_CUDA(cudaDeviceSynchronize());
  expect(same_bytes(dy.get(), y), what + ": dequantize");
}

void check_nonfinite() {
  std::vector<float> x = data(4096, 3);
  x[300] = NAN;
  x[1000] = INFINITY;
  Dev<float> dx(x.size());
  dx.put(x);
  Dev<std::uint8_t> dc(x.size());
  Dev<float> ds(16);
  Dev<unsigned> bad(1);
  bad.put({0u});
  cuda::quantize(dx.p, DType::kFloat32, x.size(), kernels::QuantParams{}, dc.p, ds.p, bad.p);
  CHECK_CUDA(cudaDeviceSynchronize());
  const auto s = ds.get();
  expect(bad.get()[0] == 2 && std::isnan(s[1]) && std::isnan(s[3]) && !std::isnan(s[0]),
         "non-finite blocks flagged");
}

void check_topk(std::size_t n, std::size_t k) {
  const std::string what = "topk n=" + std::to_string(n) + " k=" + std::to_string(k);
  std::vector<float> x = data(n, unsigned(k));
  for (std::size_t i = 0; i < n; i += 97) x[i] = std::round(x[i]);  // ties
  std::vector<std::uint32_t> idx(k);
  std::vector<float> val(k);
  kernels::topk(x.data(), n, k, idx.data(), val.data(), kernels::TopkMethod::kExact, 0,
                kernels::KernelImpl::kScalar);
  Dev<float> dx(n);
  dx.put(x);
  Dev<std::uint32_t> di(k);
  Dev<float> dv(k);
  const std::size_t ws = cuda::topk_workspace_bytes(n);
  Dev<char> work(ws);
  cuda::topk(dx.p, n, k, di.p, dv.p, work.p, ws);
  CHECK_CUDA(cudaDeviceSynchronize());
  expect(same_bytes(di.get(), idx), what + ": indices");
  expect(same_bytes(dv.get(), val), what + ": values");
}

template <typename Fn>
void time_gpu(const char* name, std::size_t n, Fn fn) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  fn();
  CHECK_CUDA(cudaEventRecord(a));
  const int reps = 20;
  for (int r = 0; r < reps; ++r) fn();
  CHECK_CUDA(cudaEventRecord(b));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  std::printf("  %-32s %10.1f us %9.1f GB/s\n", name, 1e3 * ms / reps, 4.0 * n / (1e-3 * ms / reps) / 1e9);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

void timings() {
  const std::size_t n = std::size_t(1) << 24;  // 64 MiB of float32
  const std::vector<float> x = data(n, 1);
  Dev<float> dx(n), dy(n);
  dx.put(x);
  Dev<std::uint8_t> dc(n);
  Dev<float> ds(kernels::num_blocks(n, 256));
  const std::size_t k = n / 100;
  Dev<std::uint32_t> di(k);
  Dev<float> dv(k);
  const std::size_t ws = cuda::topk_workspace_bytes(n);
  Dev<char> work(ws);
  std::printf("GPU timings, 64 MiB of float32 input:\n");
  time_gpu("quantize int8", n, [&] { cuda::quantize(dx.p, DType::kFloat32, n, {}, dc.p, ds.p); });
  time_gpu("quantize int8 stochastic", n, [&] {
    cuda::quantize(dx.p, DType::kFloat32, n, {8, 256, kernels::Rounding::kStochastic, 1}, dc.p, ds.p);
  });
  time_gpu("quantize int4", n, [&] { cuda::quantize(dx.p, DType::kFloat32, n, {4}, dc.p, ds.p); });
  time_gpu("dequantize+add int8", n, [&] { cuda::dequantize(dc.p, ds.p, n, {}, dy.p, true); });
  time_gpu("top-k 1% (radix sort)", n, [&] { cuda::topk(dx.p, n, k, di.p, dv.p, work.p, ws); });
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("zcoll_cuda_check: no CUDA device, skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("zcoll_cuda_check on %s\n", prop.name);
  using kernels::Rounding;
  for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(255), std::size_t(256), std::size_t(257),
                        std::size_t(4097), std::size_t(1) << 20, std::size_t(1) << 24})
    for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      check_quantize(n, d, {8});
      check_quantize(n, d, {8, 256, Rounding::kStochastic, 7, 3});
      check_quantize(n, d, {4});
      check_quantize(n, d, {4, 256, Rounding::kStochastic, 9});
      check_quantize(n, d, {1});
      check_quantize(n, d, {8, 40});
      check_quantize(n, d, {1, 8});
    }
  check_nonfinite();
  for (auto [n, k] : {std::pair<std::size_t, std::size_t>{1, 1},
                      {1000, 10},
                      {4097, 4097},
                      {1 << 20, 10486},
                      {1 << 24, 167772}})
    check_topk(n, k);
  timings();
  std::printf("zcoll_cuda_check: %s (%d failures)\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
