// The allreduce algorithm table (algorithm_table.h): the built-ins, one line each, then those
// registered at run time; and everything read from it (names, parsing, requirement checks).
//
// Lookups are by index: a built-in's code indexes kBuiltins (constant data, no initialisation
// at run time); a registered one's indexes a fixed array that only grows, published by an atomic
// count, so a dispatch never takes a lock nor sees an entry being written.
#include "collectives/algorithm_table.h"

#include <atomic>
#include <deque>
#include <iterator>
#include <mutex>
#include <stdexcept>

#include "collectives/algorithms.h"
#include "common/check.h"

namespace zcoll {
namespace {

// Codes 0 .. kNumBuiltins-1, in the order of the Algorithm enumerators (options.h). Columns:
// name, needs, cost, entry point (, topology_order, copy_on_one_rank); one line per algorithm,
// even where that runs past the column limit.
// clang-format off
constexpr AlgorithmDescriptor kBuiltins[] = {
    {"auto",               kNeedsNothing,         nullptr,                           nullptr},
    {"ring",               kNeedsNothing,         allreduce_ring_cost,               allreduce_ring},
    {"tree",               kNeedsNothing,         allreduce_tree_cost,               allreduce_tree},
    {"recursive_doubling", kNeedsNothing,         allreduce_recursive_doubling_cost, allreduce_recursive_doubling},
    {"halving_doubling",   kNeedsNothing,         allreduce_halving_doubling_cost,   allreduce_halving_doubling},
    {"mpi",                kNeedsNativeAllreduce, nullptr,                           allreduce_mpi, false, false},
    {"shm",                kNeedsSharedMemory,    allreduce_shm_cost,                allreduce_shm},
    {"hierarchical",       kNeedsNothing,         allreduce_hierarchical_cost,       allreduce_hierarchical},
    {"ordered_ring",       kNeedsTopology,        allreduce_ring_cost,               allreduce_ring, true},
};
// clang-format on
constexpr int kNumBuiltins = static_cast<int>(std::size(kBuiltins));
static_assert(static_cast<int>(Algorithm::kOrderedRing) < kNumBuiltins,
              "every Algorithm enumerator has a row");

constexpr int kMaxRegistered = 64;

struct Registry {
  std::mutex mu;                  // serialises registrations
  std::deque<std::string> names;  // the registered names (a deque never moves its elements)
  AlgorithmDescriptor entries[kMaxRegistered];
  std::atomic<int> count{0};  // entries[0 .. count) are complete
};

Registry& registry() {
  static Registry r;
  return r;
}

const AlgorithmDescriptor* find_by_code(int code) {
  if (code >= 0 && code < kNumBuiltins) return &kBuiltins[code];
  const int i = code - kNumBuiltins;
  if (i < 0) return nullptr;
  Registry& r = registry();
  return i < r.count.load(std::memory_order_acquire) ? &r.entries[i] : nullptr;
}

// What each need means, for messages, and whether a communicator offers it.
struct NeedInfo {
  Need need;
  const char* what;
};
constexpr NeedInfo kNeedInfo[] = {
    {kNeedsNativeAllreduce, "a transport with its own allreduce (MPI)"},
    {kNeedsSharedMemory, "every rank on one node and ZCOLL_SHM unset or 1"},
    {kNeedsTopology,
     "measured links: set ZCOLL_TOPOLOGY to a `zcoll probe` result (probe.json) or call "
     "Communicator.set_topology()"},
};

bool offers(Communicator& comm, Need need) {
  switch (need) {
    case kNeedsNativeAllreduce:
      return comm.has_native_allreduce();
    case kNeedsSharedMemory:
      return comm.has_shared_arena();
    case kNeedsTopology:
      return comm.topology().known();
    case kNeedsNothing:
      break;
  }
  return true;
}

}  // namespace

int num_allreduce_algorithms() { return kNumBuiltins + registry().count.load(std::memory_order_acquire); }

const AlgorithmDescriptor& allreduce_algorithm(Algorithm algorithm) {
  const AlgorithmDescriptor* d = find_by_code(static_cast<int>(algorithm));
  ZCOLL_REQUIRE(d != nullptr, "unknown algorithm code ", static_cast<int>(algorithm));
  return *d;
}

const AlgorithmDescriptor* find_allreduce_algorithm(const std::string& name) {
  for (int code = 0; const AlgorithmDescriptor* d = find_by_code(code); ++code)
    if (name == d->name) return d;
  return nullptr;
}

std::string allreduce_algorithm_names(const char* separator) {
  std::string names;
  for (int code = 0; const AlgorithmDescriptor* d = find_by_code(code); ++code)
    names += (code ? separator : "") + std::string(d->name);
  return names;
}

const char* algorithm_name(Algorithm algorithm) { return allreduce_algorithm(algorithm).name; }

Algorithm parse_algorithm(const std::string& name) {
  for (int code = 0; const AlgorithmDescriptor* d = find_by_code(code); ++code)
    if (name == d->name) return static_cast<Algorithm>(code);
  throw std::invalid_argument("unknown algorithm '" + name + "'; valid: " + allreduce_algorithm_names());
}

Algorithm register_allreduce_algorithm(const AlgorithmDescriptor& descriptor) {
  const std::string name = descriptor.name ? descriptor.name : "";
  ZCOLL_REQUIRE(!name.empty(), "register_allreduce_algorithm: an algorithm needs a name");
  ZCOLL_REQUIRE(descriptor.entry != nullptr, "register_allreduce_algorithm: algorithm '", name,
                "' needs an entry point");
  ZCOLL_REQUIRE((descriptor.needs & ~kAllNeeds) == 0, "register_allreduce_algorithm: unknown needs ",
                descriptor.needs, " for algorithm '", name, "'");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  ZCOLL_REQUIRE(find_allreduce_algorithm(name) == nullptr, "register_allreduce_algorithm: algorithm '", name,
                "' exists already");
  const int i = r.count.load(std::memory_order_relaxed);
  ZCOLL_REQUIRE(i < kMaxRegistered, "register_allreduce_algorithm: at most ", kMaxRegistered, " algorithms");
  r.names.push_back(name);
  r.entries[i] = descriptor;
  r.entries[i].name = r.names.back().c_str();
  r.count.store(i + 1, std::memory_order_release);
  return static_cast<Algorithm>(kNumBuiltins + i);
}

bool offers_needs(Communicator& comm, unsigned needs) {
  for (const NeedInfo& n : kNeedInfo)
    if ((needs & n.need) && !offers(comm, n.need)) return false;
  return true;
}

void require_needs(Communicator& comm, const AlgorithmDescriptor& descriptor) {
  if (descriptor.needs == kNeedsNothing) return;
  for (const NeedInfo& n : kNeedInfo)
    ZCOLL_REQUIRE(!(descriptor.needs & n.need) || offers(comm, n.need), "algorithm '", descriptor.name,
                  "' needs ", n.what, "; use 'ring' or 'auto'");
}

unsigned offered_needs(const Capabilities& caps) {
  return (caps.native_fast ? kNeedsNativeAllreduce : 0u) | (caps.shared_memory ? kNeedsSharedMemory : 0u) |
         (caps.topology ? kNeedsTopology : 0u);
}

}  // namespace zcoll
