// Every algorithm of every collective on 1..8 thread-ranks against plain-loop references
// (cases.h): counts 0, 1, primes, sizes not divisible by p, tiny segments, every dtype and op,
// in place and out of place, NaNs, random floats; results bitwise identical on every rank.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cases.h"
#include "collectives/options.h"
#include "ztest.h"

using cases::Case;
using cases::Collective;
using zcoll::Algorithm;

namespace {

constexpr int kMaxRanks = 8;

void allreduce_on_every_size(Algorithm algorithm,
                             const zcoll::InProcOptions& options = ztest::test_options()) {
  for (int p = 1; p <= kMaxRanks; ++p) cases::run_and_check(p, cases::allreduce_cases(algorithm, p), options);
}

zcoll::InProcOptions without_arena() {
  zcoll::InProcOptions o = ztest::test_options();
  o.shared_arena = false;
  return o;
}

}  // namespace

TEST(allreduce, ring) { allreduce_on_every_size(Algorithm::kRing); }
TEST(allreduce, tree) { allreduce_on_every_size(Algorithm::kTree); }
TEST(allreduce, recursive_doubling) { allreduce_on_every_size(Algorithm::kRecursiveDoubling); }
TEST(allreduce, halving_doubling) { allreduce_on_every_size(Algorithm::kHalvingDoubling); }
TEST(allreduce, shm) { allreduce_on_every_size(Algorithm::kShm); }
// The single copy (reads of the other ranks' buffers) at every size of the matrix: counts 0,
// 1, primes, not divisible by p, in place, every dtype and op; the matrix's tiny pipeline
// segments make many pieces per sub-block.
TEST(allreduce, shm_single_copy) {
  zcoll::InProcOptions o = ztest::test_options();
  o.single_copy_bytes = 1;
  o.window_in_bytes = 0;  // 2 ranks read the peer's input too
  allreduce_on_every_size(Algorithm::kShm, o);
}
// The same where 2 ranks take the peer's input through the window (results still written into
// the peer's `out`) wherever its half fits a staging buffer; other world sizes as above.
TEST(allreduce, shm_single_copy_window_in) {
  zcoll::InProcOptions o = ztest::test_options();
  o.single_copy_bytes = 1;
  o.window_in_bytes = SIZE_MAX;
  allreduce_on_every_size(Algorithm::kShm, o);
}
// The same where the transport reads but does not write other ranks' memory: results gathered.
TEST(allreduce, shm_single_copy_gathered) {
  zcoll::InProcOptions o = ztest::test_options();
  o.single_copy_bytes = 1;
  o.peer_writes = false;
  allreduce_on_every_size(Algorithm::kShm, o);
}
// auto picks shm when the transport offers shared memory, else among the message algorithms.
TEST(allreduce, auto_with_shared_memory) { allreduce_on_every_size(Algorithm::kAuto); }
TEST(allreduce, auto_without_shared_memory) { allreduce_on_every_size(Algorithm::kAuto, without_arena()); }

// The single copy reduces in the staged path's order, so random floats (whose sum depends on the
// order) give the same bits through all four (staged; single copy writing peers; single copy
// gathering; 2 ranks: the input through the window), in place and not, sum and avg.
TEST(allreduce, shm_single_copy_same_bits_as_staged) {
  for (int p = 2; p <= 5; ++p) {
    std::vector<std::vector<float>> got[4];
    for (int single = 0; single < 4; ++single) {
      zcoll::InProcOptions o = ztest::test_options();
      o.peer_memory = single != 0;
      o.peer_writes = single == 1 || single == 3;
      o.single_copy_bytes = 1;
      o.window_in_bytes = single == 3 ? SIZE_MAX : 0;
      got[single].assign(static_cast<std::size_t>(p), {});
      ON_RANKS(p, o, [&](zcoll::Communicator& comm) {
        std::mt19937 gen(1000u + static_cast<unsigned>(comm.rank()));
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::vector<float> x(100003), y(x.size());
        for (float& v : x) v = u(gen) * std::exp2(static_cast<float>(gen() % 40) - 20.0f);
        zcoll::AllreduceOptions a;
        a.algorithm = Algorithm::kShm;
        zcoll::allreduce(comm, x.data(), y.data(), x.size(), zcoll::DType::kFloat32, a);
        a.op = zcoll::ReduceOp::kAvg;
        zcoll::allreduce(comm, x.data(), x.data(), x.size(), zcoll::DType::kFloat32, a);  // in place
        y.insert(y.end(), x.begin(), x.end());
        got[single][static_cast<std::size_t>(comm.rank())] = y;
      });
    }
    ztest::Context ctx(ztest::str("p=", p));
    for (int r = 0; r < p; ++r) {
      const auto& a = got[0][static_cast<std::size_t>(r)];
      for (int single = 1; single < 4; ++single) {
        const auto& b = got[single][static_cast<std::size_t>(r)];
        CHECK(a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      }
    }
  }
}

// The shm algorithm's two paths over several blocks: a 4 KiB arena makes every block small (one
// synchronisation less, "direct"); a 256 KiB one makes blocks larger than its 32 KiB direct
// limit (stage / reduce / gather), three or more per call so both buffer pairs are reused.
TEST(allreduce, shm_blocks) {
  for (std::size_t arena : {std::size_t{4096}, std::size_t{256 * 1024}}) {
    zcoll::InProcOptions o = ztest::test_options();
    o.shared_arena_bytes = arena;
    o.peer_memory = false;  // the staged path at every size
    for (int p = 1; p <= kMaxRanks; ++p) {
      std::vector<Case> list;
      const std::pair<zcoll::DType, zcoll::ReduceOp> pairs[] = {
          {zcoll::DType::kFloat32, zcoll::ReduceOp::kSum},
          {zcoll::DType::kFloat16, zcoll::ReduceOp::kAvg},
          {zcoll::DType::kInt8, zcoll::ReduceOp::kProd},
          {zcoll::DType::kFloat64, zcoll::ReduceOp::kMax}};
      int n = 0;
      for (const auto& [dtype, op] : pairs) {
        const std::size_t block_bytes = arena == 4096 ? 1500 : 90 * 1024;
        for (std::size_t blocks : {std::size_t{1}, std::size_t{3}}) {
          Case c;
          c.collective = Collective::kAllreduce;
          c.algorithm = Algorithm::kShm;
          c.dtype = dtype;
          c.op = op;
          c.count = blocks * block_bytes / zcoll::dtype_size(dtype) + 5;
          c.in_place = n++ % 2;
          list.push_back(c);
        }
      }
      cases::run_and_check(p, list, o);
    }
  }
}

TEST(reduce_scatter, ring) {
  for (int p = 1; p <= kMaxRanks; ++p)
    cases::run_and_check(p, cases::reducing_cases(Collective::kReduceScatter, p, 0), ztest::test_options());
}

TEST(allgather, ring) {
  for (int p = 1; p <= kMaxRanks; ++p)
    cases::run_and_check(p, cases::copying_cases(Collective::kAllgather, p, 0), ztest::test_options());
}

TEST(broadcast, tree_every_root) {
  for (int p = 1; p <= kMaxRanks; ++p) {
    std::vector<Case> list;
    for (int root = 0; root < p; ++root) {
      std::vector<Case> mine = cases::copying_cases(Collective::kBroadcast, p, root);
      list.insert(list.end(), mine.begin(), mine.end());
    }
    cases::run_and_check(p, list, ztest::test_options());
  }
}

// Every root with the full matrix at the root p - 1 (the farthest from the default), a thinner
// one (every third case) at the others.
TEST(reduce, tree_every_root) {
  for (int p = 1; p <= kMaxRanks; ++p) {
    std::vector<Case> list;
    for (int root = 0; root < p; ++root) {
      std::vector<Case> mine = cases::reducing_cases(Collective::kReduce, p, root);
      for (std::size_t i = 0; i < mine.size(); ++i)
        if (root == p - 1 || i % 3 == static_cast<std::size_t>(root) % 3) list.push_back(mine[i]);
    }
    cases::run_and_check(p, list, ztest::test_options());
  }
}

// No rank leaves a barrier before every rank has entered it: each rank counts itself in before
// the barrier and, after it, must see everyone's count for this round. A different rank arrives
// late in each round.
TEST(barrier, dissemination) {
  for (int p = 1; p <= kMaxRanks; ++p) {
    constexpr int kRounds = 6;
    std::atomic<int> arrived{0};
    std::atomic<int> early_exits{0};
    ON_RANKS(p, ztest::test_options(), [&](zcoll::Communicator& comm) {
      for (int round = 0; round < kRounds; ++round) {
        if (comm.rank() == round % p) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        arrived.fetch_add(1);
        zcoll::barrier(comm);
        if (arrived.load() < (round + 1) * p) early_exits.fetch_add(1);
        zcoll::barrier(comm);  // nobody starts the next round before everyone has looked
      }
    });
    ztest::Context ctx(ztest::str("p=", p));
    CHECK_EQ(early_exits.load(), 0);
    CHECK_EQ(arrived.load(), kRounds * p);
  }
}

// Larger messages with the default segment size (several 128 KiB segments per chunk) and the
// deepest pipelines: one case per algorithm and collective.
TEST(allreduce, default_segments_and_deep_pipelines) {
  for (int p : {2, 3, 5, 8}) {
    std::vector<Case> list;
    const Algorithm algorithms[] = {Algorithm::kRing, Algorithm::kTree, Algorithm::kRecursiveDoubling,
                                    Algorithm::kHalvingDoubling, Algorithm::kShm};
    int n = 0;
    for (Algorithm a : algorithms) {
      Case c;
      c.collective = Collective::kAllreduce;
      c.algorithm = a;
      c.dtype = zcoll::DType::kFloat32;
      c.count = 100003;  // 400 KB: 4 segments of 128 KiB
      c.in_place = n++ % 2;
      list.push_back(c);
      c.dtype = zcoll::DType::kInt32;
      c.op = zcoll::ReduceOp::kProd;
      c.count = 3001;
      c.pipeline.max_segment_bytes = 64;
      c.pipeline.depth = 16;  // the deepest ZCOLL_PIPELINE_DEPTH allows
      list.push_back(c);
    }
    cases::run_and_check(p, list, ztest::test_options());
  }
}

// Every collective back to back on one communicator, no barrier between: messages of one call
// must never be taken by the next (tags, ordering, the shared arena's sequence).
TEST(mixed, collectives_back_to_back) {
  for (int p : {2, 3, 4, 7, 8}) {
    std::vector<Case> list;
    const Algorithm algorithms[] = {Algorithm::kRing, Algorithm::kShm, Algorithm::kTree,
                                    Algorithm::kRecursiveDoubling, Algorithm::kHalvingDoubling};
    const Collective order[] = {Collective::kAllreduce, Collective::kBroadcast,     Collective::kReduce,
                                Collective::kAllreduce, Collective::kReduceScatter, Collective::kAllgather};
    for (int i = 0; i < 60; ++i) {
      Case c;
      c.collective = order[i % 6];
      c.algorithm = algorithms[(i / 2) % 5];
      c.dtype = i % 4 == 0 ? zcoll::DType::kFloat64 : zcoll::DType::kInt32;
      c.op = zcoll::ReduceOp::kSum;
      c.count = static_cast<std::size_t>(1 + (i * 37) % 300);
      c.root = (i * 5) % p;
      c.in_place = c.collective != Collective::kReduceScatter && i % 3 == 0;
      c.pipeline.max_segment_bytes = i % 2 ? 96 : 0;
      c.inputs = c.collective == Collective::kAllgather || c.collective == Collective::kBroadcast
                     ? ref::Inputs::kBits
                     : ref::Inputs::kExact;
      list.push_back(c);
    }
    cases::run_and_check(p, list, ztest::test_options());
  }
}
