// Collective test cases: one case = one call of one collective on every rank. Ranks run a list
// of cases in order inside one in-process group (so consecutive calls on one communicator are
// exercised too) and keep what they got; the calling thread then checks every rank's result
// against a reference computed from every rank's input, bit for bit, and across ranks.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "collectives/options.h"
#include "comm/inproc_communicator.h"
#include "reference.h"

namespace cases {

using zcoll::Algorithm;
using zcoll::DType;
using zcoll::ReduceOp;

enum class Collective { kAllreduce, kReduceScatter, kAllgather, kBroadcast, kReduce };

struct Case {
  Collective collective = Collective::kAllreduce;
  Algorithm algorithm = Algorithm::kAuto;  // allreduce only
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::size_t count = 0;
  int root = 0;
  bool in_place = false;
  zcoll::PipelineOptions pipeline;
  ref::Inputs inputs = ref::Inputs::kExact;

  std::string name() const;
};

// Counts every test runs at p ranks: 0, 1, small primes, p - 1, p + 1, 24 p + 1, 1009.
std::vector<std::size_t> counts_for(int p);

// The allreduce matrix for `algorithm` at p ranks: every dtype x op on small counts, a few
// dtype/op pairs on longer counts with tiny segments and depths 1 and 3 (many segments per
// chunk), NaN inputs, and random floats (within tolerance).
std::vector<Case> allreduce_cases(Algorithm algorithm, int p);
// The same shapes for reduce_scatter and reduce (root given).
std::vector<Case> reducing_cases(Collective collective, int p, int root);
// Copying collectives (allgather, broadcast): every dtype with arbitrary bit patterns.
std::vector<Case> copying_cases(Collective collective, int p, int root);

// Runs the cases on p thread-ranks of a group with `options` and checks every result.
void run_and_check(int p, const std::vector<Case>& list, const zcoll::InProcOptions& options);

}  // namespace cases
