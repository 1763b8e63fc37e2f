// The pre/post step that lets power-of-two algorithms (recursive doubling, halving-doubling)
// run on any rank count (Rabenseifner; MPICH and Open MPI do the same).
//
// With pof2 the largest power of two <= p and extra = p - pof2, the first 2*extra ranks pair
// up (2i, 2i+1):
//   fold_in:  rank 2i sends its input to 2i+1, which keeps OP(in_2i, in_2i+1) in `out`;
//             rank 2i sits out of the main algorithm. Cost: alpha + S beta.
//   fold_out: rank 2i+1 sends the result back to 2i. Cost: alpha + S beta.
// The remaining pof2 ranks take "virtual" ranks 0..pof2-1 in rank order.
#pragma once
#include <cstddef>

#include "collectives/algorithm_table.h"
#include "collectives/options.h"
#include "comm/communicator.h"

namespace zcoll::detail {

struct Fold {
  int pof2 = 1;
  int extra = 0;
  int vrank = -1;     // -1: this rank sits out (it is 2i of a pair)
  bool has_partner = false;  // part of a pair (sends in fold_in or receives)

  int real_rank(int v) const { return v < extra ? 2 * v + 1 : v + extra; }
};

Fold make_fold(int rank, int p);

// log2 of the largest power of two <= p (p >= 1).
inline int log2_floor(int p) {
  int k = 0;
  while ((2 << k) <= p) ++k;
  return k;
}
// What the fold adds to an algorithm's cost: 2 alpha + 2 S beta + S gamma when p is not a power
// of two (the partner's input in, its reduction, the result back), else 0.
double fold_cost(const CostQuery& q);

// Returns true when this rank's data now lives in `out` (it received a partner's input).
bool fold_in(Communicator& comm, const Fold& fold, const void* in, void* out, std::size_t count,
             DType dtype, ReduceOp op, const PipelineOptions& pipeline);
void fold_out(Communicator& comm, const Fold& fold, void* out, std::size_t count, DType dtype,
              const PipelineOptions& pipeline);

}  // namespace zcoll::detail
