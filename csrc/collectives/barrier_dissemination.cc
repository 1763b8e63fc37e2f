// Dissemination barrier (Hensgen, Finkel and Manber).
//
// Phases:  ceil(log2 p) rounds; in round k rank r signals r + 2^k and waits for r - 2^k.
//          After the last round every rank has heard, directly or not, from every other.
//          One engine unit per round: the engine posts round k+1's signal only after round k's
//          has arrived, which is what makes it a barrier (receives posted ahead are harmless).
// Cost:    ceil(log2 p) alpha, 1 byte per message.
#include "collectives/algorithms.h"
#include "collectives/pipeline.h"

namespace zcoll {
namespace {

class Dissemination : public detail::ScheduleBase {
 public:
  Dissemination(int rank, int p) : rank_(rank), p_(p) {
    while ((1 << rounds_) < p) ++rounds_;
  }
  std::size_t num_units() const { return static_cast<std::size_t>(rounds_); }
  std::size_t max_recv_bytes() const { return 0; }
  detail::Unit unit(std::size_t k) const {
    const int dist = 1 << k;
    return detail::Unit::exchange(&token_, 1, detail::mod(rank_ + dist, p_), &sink_[k], 1,
                                  detail::mod(rank_ - dist, p_));
  }

 private:
  int rank_, p_, rounds_ = 0;
  char token_ = 0;
  mutable char sink_[32] = {};  // one per round: receives of later rounds are posted ahead
};

}  // namespace

void barrier_dissemination(Communicator& comm) {
  Dissemination schedule(comm.rank(), comm.size());
  detail::run_pipeline(comm, schedule, PipelineOptions{}, detail::kTagBarrier);
}

}  // namespace zcoll
