// The watchdog (comm/watchdog.h), the flight recorder and the link telemetry over the in-process
// transport. The watchdog: a rank that never arrives is
// named by every other rank once the deadline passes, in every algorithm's waits (messages and
// shared-memory flags); a rank whose process is gone is named without waiting for a deadline;
// an abort from another thread fails the call everywhere; afterwards the communicator is broken.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "collectives/link_stats.h"
#include "collectives/options.h"
#include "comm/inproc_communicator.h"
#include "common/error.h"
#include "ztest.h"

using zcoll::Algorithm;
using zcoll::Communicator;
using zcoll::DType;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// What one rank saw: the exception's type, text and info, and how long the failing call took.
struct Outcome {
  std::string type = "none";
  std::string what;
  zcoll::FailureInfo info;
  double seconds = 0;
};

template <typename Call>
Outcome attempt(Call call) {
  Outcome o;
  const auto t0 = Clock::now();
  try {
    call();
  } catch (const zcoll::RankLostError& e) {
    o.type = "RankLostError";
    o.what = e.what();
    o.info = e.info();
  } catch (const zcoll::TimeoutError& e) {
    o.type = "TimeoutError";
    o.what = e.what();
    o.info = e.info();
  } catch (const zcoll::BrokenError& e) {
    o.type = "BrokenError";
    o.what = e.what();
  } catch (const std::exception& e) {
    o.type = "other";
    o.what = e.what();
  }
  o.seconds = seconds_since(t0);
  return o;
}

void allreduce_with(Communicator& comm, Algorithm algorithm, std::vector<float>& x) {
  zcoll::AllreduceOptions o;
  o.algorithm = algorithm;
  o.pipeline.max_segment_bytes = 256;  // several segments: waits in the middle of a pipeline
  zcoll::allreduce(comm, x.data(), x.data(), x.size(), DType::kFloat32, o);
}

zcoll::InProcGroup& group_of(Communicator& comm) { return dynamic_cast<zcoll::InProcCommunicator&>(comm).group(); }

constexpr double kTimeout = 0.3;
constexpr double kGrace = zcoll::Watchdog::kGraceNs / 1e9;

// Ranks 0..p-2 run `call` twice (the second one times out); rank p-1 runs it once, then stays
// away until the others have failed, then makes the call they failed in. What the others posted
// for it was cancelled when they failed, so it cannot complete that call, except through shared
// memory, where the others' inputs still lie staged; it then fails in its next call.
template <typename Call>
void check_stopped_rank_is_named(const char* name, Call call, bool late_call_may_complete = false) {
  constexpr int p = 4;
  ztest::Context ctx(name);
  std::vector<Outcome> first(p), late(p), after(p);
  auto options = ztest::test_options();
  options.timeout_seconds = kTimeout;
  std::atomic<int> failed{0};
  ON_RANKS(p, options, [&](Communicator& comm) {
    const int r = comm.rank();
    call(comm);  // call #1 completes everywhere
    if (r == p - 1) {
      while (failed.load() < p - 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      late[r] = attempt([&] { call(comm); });  // the others announced their failure already
      if (late[r].type == "none" && late_call_may_complete) late[r] = attempt([&] { call(comm); });
    } else {
      first[r] = attempt([&] { call(comm); });
      failed.fetch_add(1);
    }
    after[r] = attempt([&] { call(comm); });
  });
  for (int r = 0; r < p - 1; ++r) {
    ztest::Context c(ztest::str("rank ", r));
    const Outcome& o = first[static_cast<std::size_t>(r)];
    CHECK_EQ(o.type, std::string("TimeoutError"));
    CHECK_EQ(o.info.seq, std::uint64_t{2});
    CHECK(o.info.missing == std::vector<int>{p - 1});
    CHECK(o.info.lost.empty());
    CHECK(contains(o.what, ztest::str(" #2 (")));
    CHECK(contains(o.what, "Never arrived"));
    CHECK(contains(o.what, ztest::str("rank ", p - 1)));
    CHECK_GE(o.seconds, kTimeout);
    CHECK_LE(o.seconds, kTimeout + kGrace + 1.0);
  }
  const Outcome& l = late[p - 1];
  CHECK_EQ(l.type, std::string("TimeoutError"));
  CHECK(contains(l.what, "reported") || contains(l.what, "timed out"));
  CHECK_LE(l.seconds, kGrace + 0.5);
  for (int r = 0; r < p; ++r) {
    ztest::Context c(ztest::str("after the failure, rank ", r));
    CHECK_EQ(after[static_cast<std::size_t>(r)].type, std::string("BrokenError"));
    CHECK_LE(after[static_cast<std::size_t>(r)].seconds, 0.05);
  }
}

}  // namespace

// A rank that does not come is named by the others at the deadline, in the waits of every
// algorithm: posted receives and sends (ring, tree, recursive doubling, halving-doubling,
// allgather, barrier) and shared-memory flags (shm).
TEST(watchdog, stopped_rank_is_named_by_every_other_rank) {
  const std::vector<std::pair<const char*, Algorithm>> algorithms = {
      {"ring", Algorithm::kRing},
      {"tree", Algorithm::kTree},
      {"recursive_doubling", Algorithm::kRecursiveDoubling},
      {"halving_doubling", Algorithm::kHalvingDoubling},
      {"shm", Algorithm::kShm}};
  for (const auto& [name, algorithm] : algorithms) {
    const Algorithm a = algorithm;
    check_stopped_rank_is_named(
        name,
        [a](Communicator& comm) {
          std::vector<float> x(1000, 1.0f);
          allreduce_with(comm, a, x);
        },
        a == Algorithm::kShm);
  }
  // The single copy waits on flags too, and reads the other ranks' buffers: they live outside
  // the call (a late rank may read a buffer of a rank that gave up, as over MPI, where that
  // read fails or reads stale data in a call that fails anyway).
  std::vector<std::vector<float>> buffers(4, std::vector<float>(80 * 1024, 1.0f));  // 320 KiB
  check_stopped_rank_is_named(
      "shm single copy",
      [&buffers](Communicator& comm) {
        allreduce_with(comm, Algorithm::kShm, buffers[static_cast<std::size_t>(comm.rank())]);
      },
      true);
  check_stopped_rank_is_named("allgather", [](Communicator& comm) {
    std::vector<float> x(100, 1.0f), y(100 * static_cast<std::size_t>(comm.size()));
    zcoll::allgather(comm, x.data(), y.data(), x.size(), DType::kFloat32);
  });
  check_stopped_rank_is_named("barrier", [](Communicator& comm) { zcoll::barrier(comm); });
}

// A rank whose process is gone is named as lost within a few slow checks, with no deadline.
TEST(watchdog, lost_rank_is_named_without_a_deadline) {
  constexpr int p = 4;
  std::vector<Outcome> out(p);
  auto options = ztest::test_options();
  options.timeout_seconds = 0;  // never: only liveness ends the wait
  ON_RANKS(p, options, [&](Communicator& comm) {
    std::vector<float> x(1000, 1.0f);
    allreduce_with(comm, Algorithm::kRing, x);
    if (comm.rank() == 2) {
      group_of(comm).mark_lost(2);  // "killed": never calls zcoll again
      return;
    }
    out[static_cast<std::size_t>(comm.rank())] = attempt([&] { allreduce_with(comm, Algorithm::kRing, x); });
  });
  for (int r : {0, 1, 3}) {
    ztest::Context c(ztest::str("rank ", r));
    const Outcome& o = out[static_cast<std::size_t>(r)];
    CHECK_EQ(o.type, std::string("RankLostError"));
    CHECK(o.info.lost == std::vector<int>{2});
    CHECK(o.info.missing == std::vector<int>{2});
    CHECK(contains(o.what, "rank 2"));
    CHECK_LE(o.seconds, kGrace + 1.0);
  }
}

// A rank that leaves (Watchdog::leave: its process exits with an uncaught exception) is named as
// lost and never arrived by every rank waiting for it, with no deadline; its own communicator is
// broken (BrokenError) without a failure of its own. The leaving rank's thread stays until the
// others are done, as the process does in MPI_Finalize: only its announcement tells them.
TEST(watchdog, rank_that_leaves_is_named_lost_without_a_deadline) {
  constexpr int p = 4;
  std::vector<Outcome> out(p);
  auto options = ztest::test_options();
  options.timeout_seconds = 0;  // never: only the announcement ends the wait
  std::atomic<int> first_done{0}, others_done{0};
  ON_RANKS(p, options, [&](Communicator& comm) {
    std::vector<float> x(1000, 1.0f);
    allreduce_with(comm, Algorithm::kRing, x);
    first_done.fetch_add(1);
    const int r = comm.rank();
    if (r == 2) {  // leaves once every rank has finished the first call (which it would otherwise fail)
      while (first_done.load() < p) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      comm.watchdog().leave("its process is exiting with an uncaught RuntimeError");
      comm.watchdog().leave("again");  // nothing more: already broken
      out[2] = attempt([&] { allreduce_with(comm, Algorithm::kRing, x); });
      while (others_done.load() < p - 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    out[static_cast<std::size_t>(r)] = attempt([&] { allreduce_with(comm, Algorithm::kRing, x); });
    others_done.fetch_add(1);
  });
  for (int r : {0, 1, 3}) {
    ztest::Context c(ztest::str("rank ", r));
    const Outcome& o = out[static_cast<std::size_t>(r)];
    CHECK_EQ(o.type, std::string("RankLostError"));
    CHECK(o.info.lost == std::vector<int>{2});
    CHECK(o.info.missing == std::vector<int>{2});
    CHECK(contains(o.what, "rank 2 is lost (it left: its process is exiting with an uncaught RuntimeError)"));
    CHECK_LE(o.seconds, kGrace + 1.0);
  }
  CHECK_EQ(out[2].type, std::string("BrokenError"));
  CHECK(contains(out[2].what, "rank 2 left this communicator (its process is exiting with an uncaught RuntimeError)"));
}

// request_abort from another thread fails the waiting call on this rank, and the others follow
// through its announcement; the rank that never came is still named.
TEST(watchdog, abort_from_another_thread_reaches_every_rank) {
  constexpr int p = 3;
  std::vector<Outcome> out(p);
  auto options = ztest::test_options();
  options.timeout_seconds = 0;
  std::atomic<bool> others_done{false};
  ON_RANKS(p, options, [&](Communicator& comm) {
    const int r = comm.rank();
    if (r == 2) {  // never comes; waits until the others are done so that nobody sees it lost
      while (!others_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    std::thread aborter;
    if (r == 0)
      aborter = std::thread([&comm] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        comm.watchdog().request_abort("the test gave up");
      });
    std::vector<float> x(100, 1.0f);
    out[static_cast<std::size_t>(r)] = attempt([&] { allreduce_with(comm, Algorithm::kRing, x); });
    if (aborter.joinable()) aborter.join();
    if (r == 1) others_done.store(true);
  });
  CHECK_EQ(out[0].type, std::string("TimeoutError"));
  CHECK(contains(out[0].what, "the test gave up"));
  CHECK_EQ(out[1].type, std::string("TimeoutError"));
  CHECK(contains(out[1].what, "rank 0 was aborted"));
  for (int r : {0, 1}) CHECK(out[static_cast<std::size_t>(r)].info.missing == std::vector<int>{2});
}

// Calls that complete: the same sequence numbers on every rank, nothing broken, with and
// without the watchdog.
TEST(watchdog, completed_calls_are_numbered_alike_and_leave_nothing_broken) {
  constexpr int p = 3;
  std::vector<std::uint64_t> seq(p);
  auto options = ztest::test_options();
  options.timeout_seconds = 5;
  ON_RANKS(p, options, [&](Communicator& comm) {
    std::vector<float> x(100, 1.0f);
    for (int i = 0; i < 10; ++i) {
      comm.watchdog().set_enabled(i % 2 == 0);
      allreduce_with(comm, Algorithm::kRing, x);
      zcoll::barrier(comm);
    }
    CHECK(!comm.watchdog().broken());
    seq[static_cast<std::size_t>(comm.rank())] = comm.watchdog().seq();
  });
  for (int r = 0; r < p; ++r) CHECK_EQ(seq[static_cast<std::size_t>(r)], std::uint64_t{20});
}

// The flight recorder keeps the last calls with their sequence numbers, states and per-peer
// bytes, and a failing call's dump is named in the error.
TEST(watchdog, flight_recorder_records_calls_and_the_failure_dumps_them) {
  constexpr int p = 3;
  std::vector<std::string> json(p), dump_path(p);
  auto options = ztest::test_options();
  options.timeout_seconds = kTimeout;
  ON_RANKS(p, options, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> x(300, 1.0f);
    for (int i = 0; i < 3; ++i) allreduce_with(comm, Algorithm::kRing, x);
    json[static_cast<std::size_t>(r)] = comm.recorder().json_calls();
    if (r == p - 1) return;  // never comes to call #4
    const Outcome o = attempt([&] { allreduce_with(comm, Algorithm::kRing, x); });
    dump_path[static_cast<std::size_t>(r)] = o.info.dump_path;
  });
  for (int r = 0; r < p; ++r) {
    ztest::Context c(ztest::str("rank ", r));
    const std::string& j = json[static_cast<std::size_t>(r)];
    CHECK(contains(j, "\"seq\": 3, \"collective\": \"allreduce\", \"algorithm\": \"ring\""));
    CHECK(contains(j, "\"state\": \"done\""));
    // ring: 2(p-1) steps of 100 floats to the next rank and from the previous one
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    CHECK(contains(j, ztest::str("{\"rank\": ", next, ", \"sent\": [1600, 1600], \"received\": [0, 0]}")));
    CHECK(contains(j, ztest::str("{\"rank\": ", prev, ", \"sent\": [0, 0], \"received\": [1600, 1600]}")));
  }
  for (int r = 0; r < p - 1; ++r) {
    ztest::Context c(ztest::str("rank ", r));
    const std::string& path = dump_path[static_cast<std::size_t>(r)];
    CHECK(contains(path, ztest::str("-rank", r, ".json")));
    std::FILE* f = std::fopen(path.c_str(), "r");
    CHECK(f != nullptr);
    if (!f) continue;
    std::string text(1 << 16, '\0');
    text.resize(std::fread(text.data(), 1, text.size(), f));
    std::fclose(f);
    CHECK(contains(text, "\"format\": \"zcoll-flight-recorder\""));
    CHECK(contains(text, "\"seq\": 4, \"collective\": \"allreduce\""));
    CHECK(contains(text, "\"state\": \"in_progress\""));
    std::remove(path.c_str());
  }
}

// Link telemetry: every message of a ring allreduce counted on both ends, sends and receives
// matched per link, arrivals counted per call; link_stats gathers every rank's row to every rank.
TEST(watchdog, telemetry_counts_every_message_on_both_ends) {
  constexpr int p = 4;
  constexpr int kCalls = 5;
  std::vector<std::vector<std::int64_t>> rows(p);
  ON_RANKS(p, ztest::test_options(), [&](Communicator& comm) {
    comm.telemetry().set_enabled(true);
    comm.telemetry().reset();
    std::vector<float> x(400, 1.0f);
    for (int i = 0; i < kCalls; ++i) allreduce_with(comm, Algorithm::kRing, x);
    rows[static_cast<std::size_t>(comm.rank())] = zcoll::gather_link_stats(comm, /*reset=*/true);
    const auto empty = zcoll::gather_link_stats(comm, false);  // nothing since the reset
    CHECK_EQ(empty[1], std::int64_t{0});
  });
  const std::size_t n = zcoll::link_stats_row_length(p);
  const std::size_t head = zcoll::LinkTelemetry::kHead + p, per = zcoll::LinkTelemetry::kPerPeer;
  for (int r = 0; r < p; ++r) {
    ztest::Context c(ztest::str("rank ", r));
    CHECK(rows[static_cast<std::size_t>(r)] == rows[0]);  // gathered alike everywhere
  }
  const std::vector<std::int64_t>& all = rows[0];
  CHECK_EQ(all.size(), n * p);
  const std::int64_t bytes = kCalls * 2 * (p - 1) * 100 * 4;  // 2(p-1) steps of 100 floats
  for (int i = 0; i < p; ++i) {
    ztest::Context c(ztest::str("row ", i));
    const std::int64_t* row = &all[static_cast<std::size_t>(i) * n];
    CHECK_EQ(row[1], std::int64_t{kCalls});
    for (int j = 0; j < p; ++j) {
      const std::int64_t* to = row + head + static_cast<std::size_t>(j) * per;
      const std::int64_t* back = &all[static_cast<std::size_t>(j) * n] + head + static_cast<std::size_t>(i) * per;
      CHECK_EQ(to[0], j == (i + 1) % p ? bytes : 0);  // sent to the next rank only
      CHECK_EQ(to[1], back[4]);                       // i's sends to j = j's receives from i
      CHECK_EQ(to[0], back[3]);
    }
  }
}
