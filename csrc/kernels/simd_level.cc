#include "kernels/simd_level.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/env.h"

namespace zcoll::kernels {
namespace {

SimdLevel detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c"))
    return SimdLevel::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return SimdLevel::kAvx2;
#endif
  return SimdLevel::kScalar;
}

SimdLevel from_env(SimdLevel cpu) {
  const std::string& wanted = env::get_choice(env::Var::kSimd);
  SimdLevel level = cpu;
  if (wanted == "scalar") level = SimdLevel::kScalar;
  if (wanted == "avx2") level = SimdLevel::kAvx2;
  if (wanted == "avx512") level = SimdLevel::kAvx512;
  return level < cpu ? level : cpu;
}

std::atomic<int>& current() {
  static std::atomic<int> level{static_cast<int>(from_env(detect()))};
  return level;
}

}  // namespace

SimdLevel detected_simd_level() {
  static const SimdLevel cpu = detect();
  return cpu;
}

SimdLevel simd_level() { return static_cast<SimdLevel>(current().load(std::memory_order_relaxed)); }

void set_simd_level(SimdLevel level) {
  const SimdLevel cpu = detected_simd_level();
  current().store(static_cast<int>(level < cpu ? level : cpu));
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kScalar: break;
  }
  return "scalar";
}

KernelImpl parse_kernel_impl(const std::string& name) {
  if (name == "dispatch") return KernelImpl::kDispatch;
  if (name == "scalar") return KernelImpl::kScalar;
  if (name == "avx2") return KernelImpl::kAvx2;
  if (name == "avx512") return KernelImpl::kAvx512;
  throw std::invalid_argument("unknown kernel implementation '" + name +
                              "' (expected dispatch, scalar, avx2 or avx512)");
}

const char* kernel_impl_name(KernelImpl impl) {
  if (impl == KernelImpl::kDispatch) return "dispatch";
  return simd_level_name(static_cast<SimdLevel>(static_cast<int>(impl)));
}

std::vector<KernelImpl> supported_kernel_impls() {
  std::vector<KernelImpl> impls;
  for (int level = 0; level <= static_cast<int>(detected_simd_level()); ++level)
    impls.push_back(static_cast<KernelImpl>(level));
  return impls;
}

}  // namespace zcoll::kernels
