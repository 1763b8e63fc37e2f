// Recursive-doubling allreduce.
//
// Purpose: fewest steps; wins on small messages where latency dominates.
// Phases:  1. fold_in for non-powers of two (fold.h);
//          2. log2(pof2) steps: at step k exchange the whole buffer with vrank ^ 2^k and keep
//             OP(lower vrank's data, higher vrank's data), so both partners compute the same
//             bits; the last step divides by p for avg;
//          3. fold_out.
//          Segments are pipelined across steps (segment j of step k+1 needs only segment j of
//          step k).
// Cost:    log2 p' (alpha + S beta + S gamma), p' the largest power of two <= p, + the fold
//          (2 alpha + 2 S beta + S gamma) when p is not a power of two.
#include "collectives/algorithms.h"
#include "collectives/fold.h"
#include "collectives/pipeline.h"
#include "kernels/reduce.h"

namespace zcoll {
namespace {

class RecursiveDoubling : public detail::ScheduleBase {
 public:
  RecursiveDoubling(const detail::Fold& fold, const void* in, void* out, bool data_in_out,
                    std::size_t count, DType dtype, ReduceOp op, int p, const PipelineOptions& o)
      : fold_(fold), in_(static_cast<const unsigned char*>(data_in_out ? out : in)),
        out_(static_cast<unsigned char*>(out)), count_(count), dtype_(dtype), op_(op),
        es_(dtype_size(dtype)), p_(p), nseg_(detail::num_segments(count, es_, o)) {
    while ((1 << steps_) < fold.pof2) ++steps_;
  }

  std::size_t num_units() const { return static_cast<std::size_t>(steps_) * nseg_; }
  std::size_t max_recv_bytes() const { return ((count_ + nseg_ - 1) / nseg_) * es_; }

  detail::Unit unit(std::size_t u) const {
    const int step = static_cast<int>(u / nseg_);
    const detail::Range seg = segment(u);
    const int peer = fold_.real_rank(fold_.vrank ^ (1 << step));
    detail::Unit unit =
        detail::Unit::exchange(source(step) + seg.begin * es_, seg.count * es_, peer, nullptr, seg.count * es_, peer);
    unit.wait_sends_first = source(step) == out_;
    return unit;
  }

  void on_received(std::size_t u, const detail::Slots& slots) {
    const void* data = slots.data[0];
    if (!data) return;
    const int step = static_cast<int>(u / nseg_);
    const detail::Range seg = segment(u);
    const bool lower = (fold_.vrank & (1 << step)) == 0;
    const unsigned char* mine = source(step) + seg.begin * es_;
    unsigned char* dst = out_ + seg.begin * es_;
    if (lower)
      kernels::reduce(dst, mine, data, seg.count, dtype_, op_);
    else
      kernels::reduce(dst, data, mine, seg.count, dtype_, op_);
    if (step == steps_ - 1 && op_ == ReduceOp::kAvg) kernels::divide(dst, seg.count, dtype_, p_);
  }

 private:
  const unsigned char* source(int step) const { return step == 0 ? in_ : out_; }
  detail::Range segment(std::size_t u) const {
    return detail::split(detail::Range{0, count_}, nseg_, u % nseg_);
  }

  detail::Fold fold_;
  const unsigned char* in_;
  unsigned char* out_;
  std::size_t count_;
  DType dtype_;
  ReduceOp op_;
  std::size_t es_;
  int p_;
  std::size_t nseg_;
  int steps_ = 0;
};

}  // namespace

void allreduce_recursive_doubling(Communicator& comm, const AllreduceArgs& a) {
  const detail::Fold fold = detail::make_fold(comm.rank(), comm.size());
  const bool data_in_out = detail::fold_in(comm, fold, a.in, a.out, a.count, a.dtype, a.op, a.pipeline);
  if (fold.vrank >= 0) {
    RecursiveDoubling schedule(fold, a.in, a.out, data_in_out, a.count, a.dtype, a.op, comm.size(),
                               a.pipeline);
    detail::run_pipeline(comm, schedule, a.pipeline, detail::kTagRecursiveDoubling);
  }
  detail::fold_out(comm, fold, a.out, a.count, a.dtype, a.pipeline);
}

double allreduce_recursive_doubling_cost(const CostQuery& q) {
  return detail::log2_floor(q.ranks) * (q.alpha + q.bytes * q.beta + q.bytes * q.gamma) +
         detail::fold_cost(q);
}

}  // namespace zcoll
