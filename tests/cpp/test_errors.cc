// Errors (docs/errors.md): algorithm "mpi" without a native allreduce, the check mode's
// MismatchError on every rank when ranks disagree, and bad arguments rejected before any
// communication. After each error the communicator must still work.
#include <cstring>
#include <stdexcept>
#include <vector>

#include "collectives/compression.h"
#include "collectives/options.h"
#include "common/error.h"
#include "reference.h"
#include "ztest.h"

using zcoll::Algorithm;
using zcoll::Communicator;
using zcoll::DType;
using zcoll::ReduceOp;

namespace {

constexpr int kMaxRanks = 8;

// A ring allreduce of small integers that must still give the right answer: proof that an
// earlier error left no stray message or state behind.
void check_still_works(Communicator& comm) {
  std::vector<std::int32_t> x(37), y(37, -1);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::int32_t>(i) * (comm.rank() + 1);
  zcoll::AllreduceOptions o;
  o.algorithm = Algorithm::kRing;
  zcoll::allreduce(comm, x.data(), y.data(), x.size(), DType::kInt32, o);
  const int p = comm.size();
  int wrong = 0;
  for (std::size_t i = 0; i < y.size(); ++i) wrong += y[i] != static_cast<std::int32_t>(i) * p * (p + 1) / 2;
  CHECK_EQ(wrong, 0);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs `call` on every rank and checks that every rank throws MismatchError naming `field`.
template <typename Call>
void expect_mismatch_everywhere(int p, const char* field, Call call) {
  std::vector<std::string> what(static_cast<std::size_t>(p), "no exception");
  ON_RANKS(p, ztest::test_options(), [&](Communicator& comm) {
    try {
      call(comm);
    } catch (const zcoll::MismatchError& e) {
      what[static_cast<std::size_t>(comm.rank())] = e.what();
    }
    check_still_works(comm);
  });
  for (int r = 0; r < p; ++r) {
    ztest::Context ctx(ztest::str("p=", p, " rank ", r));
    CHECK(contains(what[static_cast<std::size_t>(r)], ztest::str("disagree on the ", field)));
  }
}

}  // namespace

// The in-process transport has no native allreduce: "mpi" is the caller's mistake on every
// rank, at every size, before any message.
TEST(errors, mpi_algorithm_without_native_allreduce) {
  for (int p = 1; p <= kMaxRanks; ++p) {
    ON_RANKS(p, ztest::test_options(), [&](Communicator& comm) {
      for (std::size_t n : {std::size_t{1}, std::size_t{100}}) {
        std::vector<float> x(n, 1.0f), y(n);
        zcoll::AllreduceOptions o;
        o.algorithm = Algorithm::kMpi;
        CHECK_THROWS(zcoll::allreduce(comm, x.data(), y.data(), n, DType::kFloat32, o),
                     std::invalid_argument);
        zcoll::CompressionOptions c;
        c.algorithm = Algorithm::kMpi;
        CHECK_THROWS(zcoll::allreduce_compressed(comm, x.data(), y.data(), n, DType::kFloat32, c),
                     std::invalid_argument);
      }
      check_still_works(comm);
    });
  }
}

// An algorithm the transport cannot run is the caller's mistake whatever the count and the
// number of ranks: "mpi" without a native allreduce, "shm" without shared memory. (Found by this
// test: allreduce() used to return before looking at the algorithm when count == 0, and "shm"
// at one rank took the one-rank shortcut.)
TEST(errors, unrunnable_algorithm_rejected_at_every_count) {
  zcoll::InProcOptions no_arena = ztest::test_options();
  no_arena.shared_arena = false;
  for (int p : {1, 2, 4}) {
    ON_RANKS(p, no_arena, [&](Communicator& comm) {
      std::vector<float> x(4, 1.0f), y(4);
      zcoll::AllreduceOptions mpi;
      mpi.algorithm = Algorithm::kMpi;
      CHECK_THROWS(zcoll::allreduce(comm, x.data(), y.data(), 0, DType::kFloat32, mpi),
                   std::invalid_argument);
      zcoll::AllreduceOptions shm;
      shm.algorithm = Algorithm::kShm;
      CHECK_THROWS(zcoll::allreduce(comm, x.data(), y.data(), 0, DType::kFloat32, shm),
                   std::invalid_argument);
      CHECK_THROWS(zcoll::allreduce(comm, x.data(), y.data(), 4, DType::kFloat32, shm),
                   std::invalid_argument);
      check_still_works(comm);
    });
  }
}

// Check mode: ranks passing different counts all raise MismatchError, for every collective.
TEST(errors, check_mode_count_mismatch_every_collective) {
  for (int p = 2; p <= kMaxRanks; ++p) {
    for (int odd_rank : {p - 1, 0}) {
      auto count_of = [&](const Communicator& comm) {
        return std::size_t{40} + (comm.rank() == odd_rank ? 3 : 0);
      };
      for (Algorithm algorithm :
           {Algorithm::kAuto, Algorithm::kRing, Algorithm::kTree, Algorithm::kRecursiveDoubling,
            Algorithm::kHalvingDoubling, Algorithm::kShm}) {
        ztest::Context ctx(
            ztest::str("allreduce ", zcoll::algorithm_name(algorithm), " odd rank ", odd_rank));
        expect_mismatch_everywhere(p, "count", [&](Communicator& comm) {
          std::vector<float> x(count_of(comm), 1.0f), y(count_of(comm));
          zcoll::AllreduceOptions o;
          o.algorithm = algorithm;
          o.check_args = true;
          zcoll::allreduce(comm, x.data(), y.data(), x.size(), DType::kFloat32, o);
        });
      }
      ztest::Context ctx(ztest::str("odd rank ", odd_rank));
      expect_mismatch_everywhere(p, "count", [&](Communicator& comm) {
        std::vector<float> x(count_of(comm), 1.0f), y(count_of(comm));
        zcoll::ReduceOptions o;
        o.check_args = true;
        zcoll::reduce_scatter(comm, x.data(), y.data(), x.size(), DType::kFloat32, o);
      });
      expect_mismatch_everywhere(p, "count", [&](Communicator& comm) {
        std::vector<float> x(count_of(comm), 1.0f), y(count_of(comm) * static_cast<std::size_t>(comm.size()));
        zcoll::CollectiveOptions o;
        o.check_args = true;
        zcoll::allgather(comm, x.data(), y.data(), x.size(), DType::kFloat32, o);
      });
      expect_mismatch_everywhere(p, "count", [&](Communicator& comm) {
        std::vector<float> x(count_of(comm), 1.0f);
        zcoll::CollectiveOptions o;
        o.check_args = true;
        zcoll::broadcast(comm, x.data(), x.size(), DType::kFloat32, o);
      });
      expect_mismatch_everywhere(p, "count", [&](Communicator& comm) {
        std::vector<float> x(count_of(comm), 1.0f), y(count_of(comm));
        zcoll::ReduceOptions o;
        o.check_args = true;
        zcoll::reduce(comm, x.data(), y.data(), x.size(), DType::kFloat32, o);
      });
      expect_mismatch_everywhere(p, "count", [&](Communicator& comm) {
        std::vector<float> x(count_of(comm), 1.0f), y(count_of(comm));
        zcoll::CompressionOptions o = zcoll::parse_compression("int8");
        o.check_args = true;
        zcoll::allreduce_compressed(comm, x.data(), y.data(), x.size(), DType::kFloat32, o);
      });
    }
  }
}

// Check mode names the first field the ranks disagree on: dtype, op, root, the algorithm that
// would run, the compression (as "collective") and its shape (as "algorithm").
TEST(errors, check_mode_names_the_field) {
  for (int p : {2, 3, 8}) {
    auto odd = [&](const Communicator& comm) { return comm.rank() == p - 1; };
    expect_mismatch_everywhere(p, "dtype", [&](Communicator& comm) {
      std::vector<double> x(16, 1.0), y(16);
      zcoll::AllreduceOptions o;
      o.check_args = true;
      zcoll::allreduce(comm, x.data(), y.data(), odd(comm) ? 32 : 16,
                       odd(comm) ? DType::kFloat32 : DType::kFloat64, o);
    });
    expect_mismatch_everywhere(p, "op", [&](Communicator& comm) {
      std::vector<float> x(16, 1.0f), y(16);
      zcoll::AllreduceOptions o;
      o.check_args = true;
      o.op = odd(comm) ? ReduceOp::kMax : ReduceOp::kSum;
      zcoll::allreduce(comm, x.data(), y.data(), x.size(), DType::kFloat32, o);
    });
    expect_mismatch_everywhere(p, "algorithm", [&](Communicator& comm) {
      std::vector<float> x(16, 1.0f), y(16);
      zcoll::AllreduceOptions o;
      o.check_args = true;
      o.algorithm = odd(comm) ? Algorithm::kTree : Algorithm::kRing;
      zcoll::allreduce(comm, x.data(), y.data(), x.size(), DType::kFloat32, o);
    });
    expect_mismatch_everywhere(p, "root", [&](Communicator& comm) {
      std::vector<float> x(16, 1.0f);
      zcoll::CollectiveOptions o;
      o.check_args = true;
      o.root = odd(comm) ? 1 : 0;
      zcoll::broadcast(comm, x.data(), x.size(), DType::kFloat32, o);
    });
    expect_mismatch_everywhere(p, "root", [&](Communicator& comm) {
      std::vector<float> x(16, 1.0f), y(16);
      zcoll::ReduceOptions o;
      o.check_args = true;
      o.root = odd(comm) ? 0 : p - 1;
      zcoll::reduce(comm, x.data(), y.data(), x.size(), DType::kFloat32, o);
    });
    expect_mismatch_everywhere(p, "compression", [&](Communicator& comm) {
      std::vector<float> x(600, 1.0f), y(600);
      zcoll::CompressionOptions o = zcoll::parse_compression(odd(comm) ? "topk:0.1" : "int8");
      o.check_args = true;
      zcoll::allreduce_compressed(comm, x.data(), y.data(), x.size(), DType::kFloat32, o);
    });
    expect_mismatch_everywhere(p, "bits", [&](Communicator& comm) {
      std::vector<float> x(600, 1.0f), y(600);
      zcoll::CompressionOptions o = zcoll::parse_compression(odd(comm) ? "int4" : "int8");
      o.check_args = true;
      zcoll::allreduce_compressed(comm, x.data(), y.data(), x.size(), DType::kFloat32, o);
    });
  }
}

// Bad arguments throw std::invalid_argument on the calling rank before any message, so every
// rank passing them throws and nobody waits.
TEST(errors, bad_arguments_before_communication) {
  for (int p : {1, 2, 5}) {
    ON_RANKS(p, ztest::test_options(), [&](Communicator& comm) {
      std::vector<std::int32_t> x(8, 1), y(8);
      zcoll::AllreduceOptions avg;
      avg.op = ReduceOp::kAvg;
      CHECK_THROWS(zcoll::allreduce(comm, x.data(), y.data(), 8, DType::kInt32, avg), std::invalid_argument);
      CHECK_THROWS(zcoll::allreduce(comm, nullptr, y.data(), 8, DType::kInt32), std::invalid_argument);
      zcoll::CollectiveOptions bad_root;
      bad_root.root = p;
      CHECK_THROWS(zcoll::broadcast(comm, x.data(), 8, DType::kInt32, bad_root), std::invalid_argument);
      zcoll::ReduceOptions negative_root;
      negative_root.root = -1;
      CHECK_THROWS(zcoll::reduce(comm, x.data(), y.data(), 8, DType::kInt32, negative_root),
                   std::invalid_argument);
      std::vector<float> f(8, 1.0f), g(8);
      zcoll::CompressionOptions bits = zcoll::parse_compression("int8");
      bits.bits = 3;
      CHECK_THROWS(zcoll::allreduce_compressed(comm, f.data(), g.data(), 8, DType::kFloat32, bits),
                   std::invalid_argument);
      CHECK_THROWS(zcoll::allreduce_compressed(comm, x.data(), y.data(), 8, DType::kInt32,
                                               zcoll::CompressionOptions{}),
                   std::invalid_argument);
      check_still_works(comm);
    });
  }
}
