// The allreduce algorithm table (collectives/algorithm_table.h): the built-ins in code order, the
// requirement messages that come from the descriptors' needs, the cost models, registration's
// refusals, and docs/algorithms.md's walk-through "Adding an allreduce algorithm" followed
// literally: a toy algorithm (reduce to rank 0, broadcast back) written on the engine, described,
// registered, then run by name through the public allreduce() on 1..4 thread-ranks against the
// reference, bitwise identical on every rank.
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cases.h"
#include "collectives/algorithm_table.h"
#include "collectives/pipeline.h"
#include "kernels/reduce.h"
#include "ztest.h"

using zcoll::Algorithm;
using zcoll::AllreduceArgs;
using zcoll::Communicator;
using zcoll::CostQuery;
using zcoll::DType;
using zcoll::ReduceOp;
namespace detail = zcoll::detail;

namespace {

// ---- Step 1: the algorithm, in its own file (here: this one), as schedules on the engine ------

// Phase 1: unit u (0 .. p-2) moves rank u+1's input to rank 0, which folds it into `out` in rank
// order, out = OP(... OP(OP(in_0, in_1), in_2) ..., in_{p-1}), and divides by p for avg.
class ReduceToRoot : public detail::ScheduleBase {
 public:
  ReduceToRoot(int rank, int p, const AllreduceArgs& a)
      : rank_(rank), p_(p), a_(a), bytes_(a.count * zcoll::dtype_size(a.dtype)) {}
  std::size_t num_units() const { return static_cast<std::size_t>(p_ - 1); }
  std::size_t max_recv_bytes() const { return bytes_; }
  detail::Unit unit(std::size_t u) const {
    detail::Unit unit;
    const int from = static_cast<int>(u) + 1;
    if (rank_ == 0) unit.recv[0] = {nullptr, bytes_, from};  // into one of the engine's slots
    if (rank_ == from) unit.send[0] = {a_.in, bytes_, 0};
    return unit;
  }
  void on_received(std::size_t u, const detail::Slots& slots) {
    if (rank_ != 0) return;
    zcoll::kernels::reduce(a_.out, u == 0 ? a_.in : a_.out, slots.data[0], a_.count, a_.dtype, a_.op);
    if (u + 2 == static_cast<std::size_t>(p_) && a_.op == ReduceOp::kAvg)
      zcoll::kernels::divide(a_.out, a_.count, a_.dtype, p_);
  }

 private:
  int rank_, p_;
  const AllreduceArgs& a_;
  std::size_t bytes_;
};

// Phase 2: unit u sends rank 0's result to rank u+1, straight into its `out`.
class BroadcastFromRoot : public detail::ScheduleBase {
 public:
  BroadcastFromRoot(int rank, int p, const AllreduceArgs& a)
      : rank_(rank), p_(p), out_(a.out), bytes_(a.count * zcoll::dtype_size(a.dtype)) {}
  std::size_t num_units() const { return static_cast<std::size_t>(p_ - 1); }
  std::size_t max_recv_bytes() const { return 0; }
  detail::Unit unit(std::size_t u) const {
    detail::Unit unit;
    const int to = static_cast<int>(u) + 1;
    if (rank_ == 0) unit.send[0] = {out_, bytes_, to};
    if (rank_ == to) unit.recv[0] = {out_, bytes_, 0};
    return unit;
  }

 private:
  int rank_, p_;
  void* out_;
  std::size_t bytes_;
};

// The entry point, with the uniform signature every descriptor's entry has.
void allreduce_reduce_broadcast(Communicator& comm, const AllreduceArgs& a) {
  ReduceToRoot reduce(comm.rank(), comm.size(), a);
  detail::run_pipeline(comm, reduce, a.pipeline, static_cast<detail::Tag>(detail::kTagUser));
  BroadcastFromRoot broadcast(comm.rank(), comm.size(), a);
  detail::run_pipeline(comm, broadcast, a.pipeline, static_cast<detail::Tag>(detail::kTagUser + 1));
}

// Its cost: rank 0 takes p-1 messages in turn, reducing each, then sends p-1.
double reduce_broadcast_cost(const CostQuery& q) {
  const double p = q.ranks, S = q.bytes;
  return 2 * (p - 1) * q.alpha + 2 * (p - 1) * S * q.beta + (p - 1) * S * q.gamma;
}

// ---- Step 2: its descriptor, registered (a built-in is one line of kBuiltins instead) ---------

Algorithm reduce_broadcast() {
  static const Algorithm code = zcoll::register_allreduce_algorithm(
      {"reduce_broadcast", zcoll::kNeedsNothing, reduce_broadcast_cost, allreduce_reduce_broadcast});
  return code;
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

// ---- Step 3: its test, against the reference, by name, on 1..4 ranks --------------------------
TEST(algorithm_table, walkthrough_reduce_broadcast) {
  const Algorithm registered = reduce_broadcast();
  const Algorithm by_name = zcoll::parse_algorithm("reduce_broadcast");
  CHECK_EQ(by_name, registered);
  CHECK_EQ(std::string(zcoll::algorithm_name(by_name)), "reduce_broadcast");
  CHECK(zcoll::allreduce_algorithm_names().find(" reduce_broadcast") != std::string::npos);
  CHECK_EQ(zcoll::allreduce_algorithm(by_name).cost(CostQuery{1000, 3, 1, 1, 1}), 4 + 4000 + 2000);
  for (int p = 1; p <= 4; ++p)
    cases::run_and_check(p, cases::allreduce_cases(by_name, p), ztest::test_options());
}

// Every named code has its row, in code order, with what it needs.
TEST(algorithm_table, builtins_in_code_order) {
  const std::pair<Algorithm, const char*> named[] = {{Algorithm::kAuto, "auto"},
                                                     {Algorithm::kRing, "ring"},
                                                     {Algorithm::kTree, "tree"},
                                                     {Algorithm::kRecursiveDoubling, "recursive_doubling"},
                                                     {Algorithm::kHalvingDoubling, "halving_doubling"},
                                                     {Algorithm::kMpi, "mpi"},
                                                     {Algorithm::kShm, "shm"},
                                                     {Algorithm::kHierarchical, "hierarchical"},
                                                     {Algorithm::kOrderedRing, "ordered_ring"}};
  for (const auto& [algorithm, name] : named) {
    ztest::Context ctx(name);
    CHECK_EQ(std::string(zcoll::algorithm_name(algorithm)), name);
    CHECK_EQ(zcoll::parse_algorithm(name), algorithm);
    const zcoll::AlgorithmDescriptor& d = zcoll::allreduce_algorithm(algorithm);
    CHECK_EQ(d.entry == nullptr, algorithm == Algorithm::kAuto);
    CHECK_EQ(d.cost == nullptr, algorithm == Algorithm::kAuto || algorithm == Algorithm::kMpi);
    CHECK_EQ(d.topology_order, algorithm == Algorithm::kOrderedRing);
    CHECK_EQ(d.copy_on_one_rank, algorithm != Algorithm::kMpi);
  }
  CHECK_EQ(zcoll::allreduce_algorithm(Algorithm::kMpi).needs, unsigned{zcoll::kNeedsNativeAllreduce});
  CHECK_EQ(zcoll::allreduce_algorithm(Algorithm::kShm).needs, unsigned{zcoll::kNeedsSharedMemory});
  CHECK_EQ(zcoll::allreduce_algorithm(Algorithm::kOrderedRing).needs, unsigned{zcoll::kNeedsTopology});
  CHECK_EQ(zcoll::allreduce_algorithm(Algorithm::kRing).needs, unsigned{zcoll::kNeedsNothing});
  CHECK_THROWS(zcoll::allreduce_algorithm(static_cast<Algorithm>(-1)), std::invalid_argument);
  CHECK_THROWS(zcoll::allreduce_algorithm(static_cast<Algorithm>(zcoll::num_allreduce_algorithms())),
               std::invalid_argument);
  const std::string unknown = message_of([] { zcoll::parse_algorithm("no_such"); });
  CHECK(unknown.find("valid: auto ring tree recursive_doubling halving_doubling mpi shm hierarchical "
                     "ordered_ring") != std::string::npos);
}

// The requirement checks read the descriptors' needs; their messages are those users know.
TEST(algorithm_table, requirement_messages) {
  zcoll::InProcOptions o = ztest::test_options();
  o.shared_arena = false;
  ON_RANKS(2, o, [&](Communicator& comm) {
    std::vector<float> x(4, 1.0f), y(4);
    auto run = [&](Algorithm a) {
      return message_of([&] {
        zcoll::AllreduceOptions options;
        options.algorithm = a;
        zcoll::allreduce(comm, x.data(), y.data(), x.size(), DType::kFloat32, options);
      });
    };
    CHECK_EQ(run(Algorithm::kMpi),
             "algorithm 'mpi' needs a transport with its own allreduce (MPI); use 'ring' or 'auto'");
    CHECK_EQ(run(Algorithm::kShm),
             "algorithm 'shm' needs every rank on one node and ZCOLL_SHM unset or 1; use 'ring' or 'auto'");
    CHECK_EQ(run(Algorithm::kOrderedRing),
             "algorithm 'ordered_ring' needs measured links: set ZCOLL_TOPOLOGY to a `zcoll probe` result "
             "(probe.json) or call Communicator.set_topology(); use 'ring' or 'auto'");
    CHECK(!zcoll::offers_needs(comm, zcoll::kNeedsSharedMemory));
    CHECK(zcoll::offers_needs(comm, zcoll::kNeedsNothing));
  });
}

// The models at a few points, against the formulas written out again (docs/algorithms.md).
TEST(algorithm_table, costs) {
  auto cost = [](Algorithm a, CostQuery q) { return zcoll::allreduce_algorithm(a).cost(q); };
  const double alpha = 1e-6, beta = 1e-9, gamma = 1e-10;
  for (int p : {2, 3, 4, 6, 8}) {
    for (double S : {4096.0, 1e6, 6e7}) {
      ztest::Context ctx(ztest::str("p=", p, " S=", S));
      const CostQuery q{S, p, alpha, beta, gamma};
      const double ring = 2 * (p - 1) * alpha + 2.0 * (p - 1) / p * S * beta + (p - 1.0) / p * S * gamma;
      const int k = static_cast<int>(std::floor(std::log2(p)));
      const double pp = std::pow(2.0, k);
      const double fold = pp == p ? 0.0 : 2 * alpha + 2 * S * beta + S * gamma;
      CHECK_LE(std::fabs(cost(Algorithm::kRing, q) - ring), 1e-12 * ring);
      CHECK_EQ(cost(Algorithm::kOrderedRing, q), cost(Algorithm::kRing, q));
      CHECK_LE(
          std::fabs(cost(Algorithm::kRecursiveDoubling, q) - (k * (alpha + S * beta + S * gamma) + fold)),
          1e-12 * ring);
      CHECK_LE(std::fabs(cost(Algorithm::kHalvingDoubling, q) -
                         (2 * k * alpha + 2 * (pp - 1) / pp * S * beta + (pp - 1) / pp * S * gamma + fold)),
               1e-12 * ring);
      // One node of p ranks: the hierarchical model is the ring's.
      CHECK_LE(std::fabs(cost(Algorithm::kHierarchical, q) - ring), 1e-12 * ring);
      CHECK_GT(cost(Algorithm::kTree, q), 0.0);
      CHECK_GT(cost(Algorithm::kShm, q), 0.0);
    }
  }
  // 2 nodes x 2 ranks: the node-local stages as a ring of 2 over S, then a ring of 2 over S/2.
  const CostQuery q{1e6, 4, alpha, beta, gamma, 2};
  const double want = (2 * alpha + 1e6 * beta + 0.5e6 * gamma) + (2 * alpha + 0.5e6 * beta + 0.25e6 * gamma);
  CHECK_LE(std::fabs(cost(Algorithm::kHierarchical, q) - want), 1e-12 * want);
}

TEST(algorithm_table, registration_refusals) {
  reduce_broadcast();
  auto refused = [](zcoll::AlgorithmDescriptor d) {
    return message_of([&] { zcoll::register_allreduce_algorithm(d); });
  };
  const int before = zcoll::num_allreduce_algorithms();
  CHECK(refused({"ring", 0, nullptr, allreduce_reduce_broadcast}).find("exists already") !=
        std::string::npos);
  CHECK(refused({"reduce_broadcast", 0, nullptr, allreduce_reduce_broadcast}).find("exists already") !=
        std::string::npos);
  CHECK(refused({"", 0, nullptr, allreduce_reduce_broadcast}).find("needs a name") != std::string::npos);
  CHECK(refused({"no_entry", 0, nullptr, nullptr}).find("needs an entry point") != std::string::npos);
  CHECK(refused({"odd_needs", 1u << 20, nullptr, allreduce_reduce_broadcast}).find("unknown needs") !=
        std::string::npos);
  CHECK_EQ(zcoll::num_allreduce_algorithms(), before);
}
