#include "collectives/fold.h"

#include "collectives/pipeline.h"
#include "kernels/reduce.h"

namespace zcoll::detail {

Fold make_fold(int rank, int p) {
  Fold f;
  while (f.pof2 * 2 <= p) f.pof2 *= 2;
  f.extra = p - f.pof2;
  if (rank < 2 * f.extra) {
    f.has_partner = true;
    f.vrank = rank % 2 ? rank / 2 : -1;
  } else {
    f.vrank = rank - f.extra;
  }
  return f;
}

namespace {

// One-directional segmented transfer: `sender` sends buf segments, `receiver` receives them
// into a slot (then combines) or straight into place.
class OneWay : public ScheduleBase {
 public:
  OneWay(const void* send, void* recv_into, std::size_t count, std::size_t es, int peer, bool sending,
         const PipelineOptions& o)
      : send_(static_cast<const unsigned char*>(send)), recv_into_(static_cast<unsigned char*>(recv_into)),
        count_(count), es_(es), peer_(peer), sending_(sending), nseg_(num_segments(count, es, o)) {}

  std::size_t num_units() const { return nseg_; }
  std::size_t max_recv_bytes() const { return ((count_ + nseg_ - 1) / nseg_) * es_; }
  Range segment(std::size_t u) const { return split(Range{0, count_}, nseg_, u); }

  Unit unit(std::size_t u) const {
    const Range seg = segment(u);
    Unit unit;
    if (sending_)
      unit.send[0] = {send_ + seg.begin * es_, seg.count * es_, peer_};
    else
      unit.recv[0] = {recv_into_ ? recv_into_ + seg.begin * es_ : nullptr, seg.count * es_, peer_};
    return unit;
  }

 protected:
  const unsigned char* send_;
  unsigned char* recv_into_;
  std::size_t count_, es_;
  int peer_;
  bool sending_;
  std::size_t nseg_;
};

class FoldIn : public OneWay {
 public:
  FoldIn(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op, int peer,
         bool sending, const PipelineOptions& o)
      : OneWay(in, nullptr, count, dtype_size(dtype), peer, sending, o),
        out_(static_cast<unsigned char*>(out)), dtype_(dtype), op_(op) {}

  void on_received(std::size_t u, const Slots& slots) {
    const void* data = slots.data[0];
    if (!data) return;
    const Range seg = segment(u);
    // The partner has the lower rank: its data is the left operand.
    kernels::reduce(out_ + seg.begin * es_, data, send_ + seg.begin * es_, seg.count, dtype_, op_);
  }

 private:
  unsigned char* out_;
  DType dtype_;
  ReduceOp op_;
};

using FoldOut = OneWay;

}  // namespace

bool fold_in(Communicator& comm, const Fold& fold, const void* in, void* out, std::size_t count,
             DType dtype, ReduceOp op, const PipelineOptions& pipeline) {
  if (!fold.has_partner) return false;
  const int rank = comm.rank();
  const bool sending = fold.vrank < 0;
  // The receiver reads its own `in` as the right operand; the sender's buffer is `in` too.
  FoldIn schedule(in, out, count, dtype, op, sending ? rank + 1 : rank - 1, sending, pipeline);
  run_pipeline(comm, schedule, pipeline, kTagFoldIn);
  return !sending;
}

void fold_out(Communicator& comm, const Fold& fold, void* out, std::size_t count, DType dtype,
              const PipelineOptions& pipeline) {
  if (!fold.has_partner) return;
  const int rank = comm.rank();
  const bool sending = fold.vrank >= 0;
  FoldOut schedule(out, out, count, dtype_size(dtype), sending ? rank - 1 : rank + 1, sending, pipeline);
  run_pipeline(comm, schedule, pipeline, kTagFoldOut);
}

double fold_cost(const CostQuery& q) {
  if (q.ranks == (1 << log2_floor(q.ranks))) return 0.0;
  return 2 * q.alpha + 2 * q.bytes * q.beta + q.bytes * q.gamma;
}

}  // namespace zcoll::detail
