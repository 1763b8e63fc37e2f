// Check mode (ZCOLL_CHECK=1 or check_args): before a collective, every rank allgathers a
// fixed-size CallHeader (algorithms.h) describing its call over the same communicator. A
// mismatch that would otherwise hang or corrupt (one rank sending more bytes than another
// expects) becomes a MismatchError raised on every rank, since every rank sees every header.
// Cost: one ring allgather of p x 96 bytes: (p-1) alpha.
#include <cstring>
#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/compression.h"
#include "collectives/ring.h"
#include "common/check.h"
#include "common/env.h"
#include "common/error.h"

namespace zcoll::detail {
namespace {

constexpr int kFields = sizeof(CallHeader) / sizeof(long long);
static_assert(sizeof(CallHeader) == kFields * sizeof(long long), "CallHeader is a flat array of 64-bit fields");
constexpr const char* kFieldNames[kFields] = {"collective", "dtype", "op",          "count", "root",
                                              "algorithm",  "compression", "bits", "block", "ratio",
                                              "exact_topk", "ring order"};
constexpr const char* kCollectiveNames[] = {"allreduce", "reduce_scatter", "allgather",
                                            "broadcast", "reduce",         "compressed allreduce"};

// A field's value as a person reads it: names for enums, the ratio as a number.
std::string describe(int field, long long v) {
  try {
    switch (field) {
      case 0:
        if (v >= 0 && v < static_cast<long long>(std::size(kCollectiveNames))) return kCollectiveNames[v];
        break;
      case 1: return dtype_name(static_cast<DType>(v));
      case 2: return op_name(static_cast<ReduceOp>(v));
      case 5: return algorithm_name(static_cast<Algorithm>(v));
      case 6: return compression_kind_name(static_cast<Compression>(v));
      case 9: {
        double ratio;
        std::memcpy(&ratio, &v, sizeof ratio);
        return concat(ratio);
      }
      default: break;
    }
  } catch (const std::invalid_argument&) {
  }
  return std::to_string(v);
}

}  // namespace

bool check_mode_from_env() { return env::get_bool(env::Var::kCheck); }

void check_same_call(Communicator& comm, const CallHeader& mine, bool requested) {
  if (!requested && !check_mode_from_env()) return;
  const int p = comm.size();
  if (p == 1) return;
  std::vector<long long> all(static_cast<std::size_t>(p) * kFields);
  std::memcpy(&all[static_cast<std::size_t>(comm.rank()) * kFields], &mine, sizeof mine);
  ring_allgather_phase(comm, all.data(), all.size(), DType::kInt64, /*shift=*/0, PipelineOptions{}, kTagCheck);
  for (int f = 0; f < kFields; ++f)
    for (int r = 1; r < p; ++r) {
      const long long theirs = all[static_cast<std::size_t>(r) * kFields + f];
      if (theirs != all[f])
        throw MismatchError(concat("ranks disagree on the ", kFieldNames[f], " of this collective: rank 0 passed ",
                                   describe(f, all[f]), ", rank ", r, " passed ", describe(f, theirs),
                                   " (detected by ZCOLL_CHECK; every rank raises this)"));
    }
}

}  // namespace zcoll::detail
