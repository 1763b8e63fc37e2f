// Halving-doubling allreduce (Rabenseifner; Open MPI's default for large messages).
//
// Purpose: bandwidth-optimal like the ring, in 2 log2(p) steps instead of 2(p-1).
// Phases:  1. fold_in for non-powers of two (fold.h);
//          2. recursive halving (a reduce-scatter): at step k (distance pof2/2^(k+1)) split the
//             current range in two, send the half the partner keeps, reduce the received half
//             into the kept one as OP(lower vrank's data, higher vrank's data); after log2(pof2)
//             steps each rank owns one fully reduced block (divided by p for avg);
//          3. recursive doubling (an allgather): the same steps in reverse, exchanging owned
//             ranges straight into `out`;
//          4. fold_out.
//          Every block is reduced once by its owner and then copied: bitwise identical results.
// Cost:    2 log2 p' alpha + 2(p'-1)/p' S beta + (p'-1)/p' S gamma, p' the largest power of two
//          <= p, + the fold (2 alpha + 2 S beta + S gamma) when p is not a power of two.
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/fold.h"
#include "collectives/pipeline.h"
#include "kernels/reduce.h"

namespace zcoll {
namespace {

using detail::Range;

struct Step {
  int peer;
  bool lower;       // this rank has the lower vrank of the pair
  Range keep;       // the half this rank reduces (and owns afterwards)
  Range give;       // the half the partner reduces
  std::size_t nseg;
  std::size_t first_unit;
};

std::vector<Step> plan_steps(const detail::Fold& fold, std::size_t count, std::size_t es,
                             const PipelineOptions& o) {
  std::vector<Step> steps;
  Range range{0, count};
  std::size_t units = 0;
  for (int mask = fold.pof2 / 2; mask >= 1; mask /= 2) {
    const bool lower = (fold.vrank & mask) == 0;
    const Range lo{range.begin, range.count / 2};
    const Range hi{range.begin + lo.count, range.count - lo.count};
    Step s{fold.real_rank(fold.vrank ^ mask), lower, lower ? lo : hi, lower ? hi : lo, 0, units};
    // Segment both halves alike so sender and receiver agree on every message.
    s.nseg = detail::num_segments(hi.count, es, o);
    units += s.nseg;
    steps.push_back(s);
    range = s.keep;
  }
  return steps;
}

// Finds the step of unit u (few steps: a linear scan is cheapest).
template <typename Steps>
std::size_t step_of(const Steps& steps, std::size_t u) {
  std::size_t k = 0;
  while (k + 1 < steps.size() && steps[k + 1].first_unit <= u) ++k;
  return k;
}

class Halving : public detail::ScheduleBase {
 public:
  Halving(const std::vector<Step>& steps, const void* in, void* out, bool data_in_out, DType dtype,
          ReduceOp op, int p)
      : steps_(steps), in_(static_cast<const unsigned char*>(data_in_out ? out : in)),
        out_(static_cast<unsigned char*>(out)), dtype_(dtype), op_(op), es_(dtype_size(dtype)), p_(p) {}

  std::size_t num_units() const { return steps_.empty() ? 0 : steps_.back().first_unit + steps_.back().nseg; }
  std::size_t max_recv_bytes() const {
    std::size_t m = 0;
    for (const auto& s : steps_) m = std::max(m, ((s.keep.count + s.nseg - 1) / s.nseg + 1) * es_);
    return m;
  }

  detail::Unit unit(std::size_t u) const {
    const std::size_t k = step_of(steps_, u);
    const Step& s = steps_[k];
    const Range give = detail::split(s.give, s.nseg, u - s.first_unit);
    const Range keep = detail::split(s.keep, s.nseg, u - s.first_unit);
    return detail::Unit::exchange(source(k) + give.begin * es_, give.count * es_, s.peer, nullptr,
                                  keep.count * es_, s.peer);
  }

  void on_received(std::size_t u, const detail::Slots& slots) {
    const void* data = slots.data[0];
    if (!data) return;
    const std::size_t k = step_of(steps_, u);
    const Step& s = steps_[k];
    const Range keep = detail::split(s.keep, s.nseg, u - s.first_unit);
    const unsigned char* mine = source(k) + keep.begin * es_;
    unsigned char* dst = out_ + keep.begin * es_;
    if (s.lower)
      kernels::reduce(dst, mine, data, keep.count, dtype_, op_);
    else
      kernels::reduce(dst, data, mine, keep.count, dtype_, op_);
    if (k + 1 == steps_.size() && op_ == ReduceOp::kAvg) kernels::divide(dst, keep.count, dtype_, p_);
  }

 private:
  const unsigned char* source(std::size_t k) const { return k == 0 ? in_ : out_; }

  const std::vector<Step>& steps_;
  const unsigned char* in_;
  unsigned char* out_;
  DType dtype_;
  ReduceOp op_;
  std::size_t es_;
  int p_;
};

// The halving steps in reverse: send what this rank owns, receive the partner's half in place.
class Doubling : public detail::ScheduleBase {
 public:
  Doubling(const std::vector<Step>& steps, void* out, std::size_t es)
      : steps_(steps.rbegin(), steps.rend()), out_(static_cast<unsigned char*>(out)), es_(es) {
    std::size_t units = 0;
    for (auto& s : steps_) {
      s.first_unit = units;
      units += s.nseg;
    }
  }

  std::size_t num_units() const { return steps_.empty() ? 0 : steps_.back().first_unit + steps_.back().nseg; }
  std::size_t max_recv_bytes() const { return 0; }
  detail::Unit unit(std::size_t u) const {
    const Step& s = steps_[step_of(steps_, u)];
    const Range keep = detail::split(s.keep, s.nseg, u - s.first_unit);
    const Range give = detail::split(s.give, s.nseg, u - s.first_unit);
    return detail::Unit::exchange(out_ + keep.begin * es_, keep.count * es_, s.peer, out_ + give.begin * es_,
                                  give.count * es_, s.peer);
  }

 private:
  std::vector<Step> steps_;
  unsigned char* out_;
  std::size_t es_;
};

}  // namespace

void allreduce_halving_doubling(Communicator& comm, const AllreduceArgs& a) {
  const detail::Fold fold = detail::make_fold(comm.rank(), comm.size());
  const bool data_in_out = detail::fold_in(comm, fold, a.in, a.out, a.count, a.dtype, a.op, a.pipeline);
  if (fold.vrank >= 0) {
    const std::size_t es = dtype_size(a.dtype);
    const std::vector<Step> steps = plan_steps(fold, a.count, es, a.pipeline);
    Halving halving(steps, a.in, a.out, data_in_out, a.dtype, a.op, comm.size());
    detail::run_pipeline(comm, halving, a.pipeline, detail::kTagHalving);
    Doubling doubling(steps, a.out, es);
    detail::run_pipeline(comm, doubling, a.pipeline, detail::kTagDoubling);
  }
  detail::fold_out(comm, fold, a.out, a.count, a.dtype, a.pipeline);
}

double allreduce_halving_doubling_cost(const CostQuery& q) {
  const int k = detail::log2_floor(q.ranks);
  const double pp = 1 << k, S = q.bytes;
  return 2 * k * q.alpha + 2 * (pp - 1) / pp * S * q.beta + (pp - 1) / pp * S * q.gamma +
         detail::fold_cost(q);
}

}  // namespace zcoll
