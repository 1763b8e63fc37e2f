// The in-process transport itself (comm/inproc_communicator.h): matching and ordering,
// rendezvous completion, size checks, failure propagation, stall reports, the shared arena.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include "collectives/options.h"
#include "comm/inproc_communicator.h"
#include "ztest.h"

using zcoll::Communicator;
using zcoll::InProcOptions;
using zcoll::Request;

namespace {

// The transport's requests driven by hand (algorithms go through the engine instead).
void wait_all(Communicator& comm, std::vector<Request>& requests) {
  for (auto& r : requests) comm.wait(r);
  requests.clear();
}

void sendrecv(Communicator& comm, const void* send_buf, std::size_t send_bytes, int dst, void* recv_buf,
              std::size_t recv_bytes, int src, int tag) {
  Request r = comm.irecv(recv_buf, recv_bytes, src, tag);
  Request s = comm.isend(send_buf, send_bytes, dst, tag);
  comm.wait(r);
  comm.wait(s);
}

// run_ranks' failure, caught: the RankFailure (or nothing).
struct Failure {
  bool thrown = false;
  int rank = -2;
  std::string what;
  std::exception_ptr original;
};

Failure run_expecting_failure(int p, const std::function<void(Communicator&)>& fn, InProcOptions options) {
  Failure f;
  try {
    zcoll::run_ranks(p, fn, options);
  } catch (const zcoll::RankFailure& e) {
    f.thrown = true;
    f.rank = e.rank();
    f.what = e.what();
    f.original = e.original();
  }
  return f;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// Messages between one pair with one tag arrive in order, whatever the interleaving with other
// tags and whichever side posts first.
TEST(inproc, order_per_pair_and_tag) {
  constexpr int kMessages = 50;
  ON_RANKS(2, ztest::test_options(), [&](Communicator& comm) {
    if (comm.rank() == 0) {
      std::vector<std::uint32_t> out(2 * kMessages);
      std::vector<Request> sends;
      for (int i = 0; i < kMessages; ++i) {
        out[2 * i] = 1000 + i;
        out[2 * i + 1] = 2000 + i;
        sends.push_back(comm.isend(&out[2 * i], 4, 1, /*tag=*/7));
        sends.push_back(comm.isend(&out[2 * i + 1], 4, 1, /*tag=*/8));
      }
      wait_all(comm, sends);
    } else {
      // Tag 8 first (its sends are interleaved with tag 7's), then tag 7, half of each posted
      // before the sends arrive and half after.
      std::vector<std::uint32_t> in(2 * kMessages, 0);
      std::vector<Request> recvs;
      for (int i = 0; i < kMessages; ++i) recvs.push_back(comm.irecv(&in[kMessages + i], 4, 0, 8));
      for (int i = 0; i < kMessages; ++i) recvs.push_back(comm.irecv(&in[i], 4, 0, 7));
      wait_all(comm, recvs);
      for (int i = 0; i < kMessages; ++i) {
        CHECK_EQ(in[i], 1000u + i);
        CHECK_EQ(in[kMessages + i], 2000u + i);
      }
    }
  });
}

// A send completes only once it has been received (rendezvous), and then test() says so.
TEST(inproc, send_completes_when_received) {
  ON_RANKS(2, ztest::test_options(), [&](Communicator& comm) {
    int value = 42, got = 0, go = 1;
    if (comm.rank() == 0) {
      Request s = comm.isend(&value, sizeof value, 1, 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      CHECK(!comm.test(s));  // rank 1 posts no receive before our "go"
      CHECK(s.active);
      Request g = comm.isend(&go, sizeof go, 1, 2);
      comm.wait(g);
      comm.wait(s);
      CHECK(!s.active);
      CHECK(comm.test(s));  // inactive: complete
      comm.wait(s);         // and waiting again is a no-op
    } else {
      Request g = comm.irecv(&go, sizeof go, 0, 2);
      comm.wait(g);
      Request r = comm.irecv(&got, sizeof got, 0, 1);
      while (!comm.test(r)) std::this_thread::yield();
      CHECK_EQ(got, 42);
    }
  });
}

// A receive posted before its send: once posted, the send completes without another call of
// the receiver, so a ring of "irecv; isend; wait(send); wait(recv)" finishes (MPI semantics).
// Also messages to oneself and empty messages.
TEST(inproc, posted_receive_self_and_empty) {
  ON_RANKS(3, ztest::test_options(), [&](Communicator& comm) {
    const int me = comm.rank(), next = (me + 1) % 3, prev = (me + 2) % 3;
    long got = -1, mine = 100 + me;
    Request r = comm.irecv(&got, sizeof got, prev, 3);
    zcoll::barrier(comm);  // every receive is posted before any send
    Request s = comm.isend(&mine, sizeof mine, next, 3);
    comm.wait(s);
    comm.wait(r);
    CHECK_EQ(got, 100 + prev);

    long self = 0, to_self = 7 * me;
    sendrecv(comm, &to_self, sizeof to_self, me, &self, sizeof self, me, 4);
    CHECK_EQ(self, 7 * me);

    Request e = comm.irecv(nullptr, 0, prev, 5);
    Request f = comm.isend(nullptr, 0, next, 5);
    comm.wait(e);
    comm.wait(f);
  });
}

// Every rank sends to every rank (itself included) on several tags, receives posted in another
// order: each (source, tag) stream arrives complete and in order.
TEST(inproc, all_to_all_streams) {
  for (int p : {2, 5, 8}) {
    constexpr int kTags = 3, kPerStream = 6;
    ON_RANKS(p, ztest::test_options(), [&](Communicator& comm) {
      const int me = comm.rank();
      auto value = [&](int src, int dst, int tag, int k) { return ((src * 16 + dst) * 16 + tag) * 16 + k; };
      std::vector<int> out, in(static_cast<std::size_t>(p) * kTags * kPerStream, -1);
      out.reserve(static_cast<std::size_t>(p) * kTags * kPerStream);
      std::vector<Request> reqs;
      for (int tag = kTags - 1; tag >= 0; --tag)
        for (int src = p - 1; src >= 0; --src)
          for (int k = 0; k < kPerStream; ++k)
            reqs.push_back(comm.irecv(&in[static_cast<std::size_t>((src * kTags + tag) * kPerStream + k)],
                                      sizeof(int), src, 20 + tag));
      for (int k = 0; k < kPerStream; ++k)
        for (int d = 0; d < p; ++d)
          for (int tag = 0; tag < kTags; ++tag) {
            const int dst = (me + d) % p;
            out.push_back(value(me, dst, tag, k));
            reqs.push_back(comm.isend(&out.back(), sizeof(int), dst, 20 + tag));
          }
      wait_all(comm, reqs);
      int wrong = 0;
      for (int src = 0; src < p; ++src)
        for (int tag = 0; tag < kTags; ++tag)
          for (int k = 0; k < kPerStream; ++k)
            wrong +=
                in[static_cast<std::size_t>((src * kTags + tag) * kPerStream + k)] != value(src, me, tag, k);
      CHECK_EQ(wrong, 0);
      CHECK_EQ(comm.stats().messages_sent, static_cast<std::uint64_t>(p * kTags * kPerStream));
      CHECK_EQ(comm.stats().bytes_sent, static_cast<std::uint64_t>(p * kTags * kPerStream) * sizeof(int));
    });
  }
}

// A send and a receive of different sizes: both requests fail, naming both sizes.
TEST(inproc, size_mismatch_fails_both_sides) {
  std::atomic<int> errors{0};
  ON_RANKS(2, ztest::test_options(), [&](Communicator& comm) {
    char buf[16] = {};
    Request r = comm.rank() == 0 ? comm.isend(buf, 8, 1, 9) : comm.irecv(buf, 16, 0, 9);
    try {
      comm.wait(r);
    } catch (const zcoll::Error& e) {
      CHECK(contains(e.what(), "sent 8 bytes"));
      CHECK(contains(e.what(), "expects 16 bytes"));
      errors.fetch_add(1);
    }
  });
  CHECK_EQ(errors.load(), 2);
}

// The first exception of a rank reaches the caller with its rank and original type; the ranks
// blocked waiting for the failed one are released.
TEST(inproc, failure_propagates_and_releases_waiters) {
  for (int p : {2, 4, 8}) {
    std::atomic<int> released{0};
    const Failure f = run_expecting_failure(
        p,
        [&](Communicator& comm) {
          if (comm.rank() == p - 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            throw std::invalid_argument("deliberate failure");
          }
          int x = 0;
          try {
            Request r = comm.irecv(&x, sizeof x, p - 1, 1);  // never sent
            comm.wait(r);
          } catch (const zcoll::GroupAborted& e) {
            if (contains(e.what(), "deliberate failure")) released.fetch_add(1);
            throw;
          }
        },
        ztest::test_options());
    ztest::Context ctx(ztest::str("p=", p));
    CHECK(f.thrown);
    CHECK_EQ(f.rank, p - 1);
    CHECK(contains(f.what, ztest::str("rank ", p - 1, " of ", p, ": deliberate failure")));
    CHECK_THROWS(std::rethrow_exception(f.original), std::invalid_argument);
    CHECK_EQ(released.load(), p - 1);
  }
}

// A deadlock (both ranks wait to receive, nobody sends) is reported, with what each rank waits
// for, instead of hanging.
TEST(inproc, stall_is_reported) {
  InProcOptions o = ztest::test_options();
  o.stall_seconds = 1.0;
  const Failure f = run_expecting_failure(
      3,
      [&](Communicator& comm) {
        if (comm.rank() == 2) return;
        int x = 0;
        Request r = comm.irecv(&x, sizeof x, 1 - comm.rank(), 11);
        comm.wait(r);
      },
      o);
  CHECK(f.thrown);
  CHECK_EQ(f.rank, -1);
  CHECK(contains(f.what, "rank 0: waits for a message from rank 1 (tag 11, 4 bytes)"));
  CHECK(contains(f.what, "rank 1: waits for a message from rank 0 (tag 11, 4 bytes)"));
  CHECK(contains(f.what, "rank 2: finished"));
}

// A send that can only complete after a receive posted later on the same rank: rendezvous makes
// this deadlock at every size (MPI only beyond its eager limit), and the report says so.
TEST(inproc, send_waiting_for_receive_is_a_stall) {
  InProcOptions o = ztest::test_options();
  o.stall_seconds = 1.0;
  const Failure f = run_expecting_failure(
      2,
      [&](Communicator& comm) {
        int out = comm.rank(), in = -1;
        const int peer = 1 - comm.rank();
        Request s = comm.isend(&out, sizeof out, peer, 12);
        comm.wait(s);  // both ranks: wait for the send before posting the receive
        Request r = comm.irecv(&in, sizeof in, peer, 12);
        comm.wait(r);
      },
      o);
  CHECK(f.thrown);
  CHECK(contains(f.what, "rank 0: waits for rank 1 to receive its send (tag 12, 4 bytes)"));
}

// The shared arena: allocated collectively, the same regions on every rank, 64-byte aligned,
// region_bytes as configured; data and flags written by one rank are seen by the others.
TEST(inproc, shared_arena) {
  for (int p : {1, 3, 8}) {
    InProcOptions o = ztest::test_options();
    o.shared_arena_bytes = 8192;
    std::vector<std::vector<unsigned char*>> seen(static_cast<std::size_t>(p));
    ON_RANKS(p, o, [&](Communicator& comm) {
      CHECK(comm.has_shared_arena());
      zcoll::SharedArena* a = comm.shared_arena();
      CHECK(a != nullptr);
      if (!a) return;
      CHECK(a == comm.shared_arena());  // allocated once
      CHECK_EQ(a->region_bytes, std::size_t{8192});
      CHECK_EQ(a->regions.size(), static_cast<std::size_t>(p));
      seen[static_cast<std::size_t>(comm.rank())] = a->regions;
      for (auto* region : a->regions) CHECK_EQ(reinterpret_cast<std::uintptr_t>(region) % 64, 0u);
      std::memset(a->data(comm.rank()), comm.rank() + 1, a->region_bytes);
      a->publish(comm.rank(), 0, 1);
      a->wait_all(0, 1);
      for (int r = 0; r < p; ++r) {
        CHECK_EQ(static_cast<int>(a->data(r)[0]), r + 1);
        CHECK_EQ(static_cast<int>(a->data(r)[a->region_bytes - 1]), r + 1);
      }
    });
    for (int r = 1; r < p; ++r) CHECK(seen[static_cast<std::size_t>(r)] == seen[0]);
  }
  InProcOptions none = ztest::test_options();
  none.shared_arena = false;
  ON_RANKS(2, none, [&](Communicator& comm) {
    CHECK(!comm.has_shared_arena());
    CHECK(comm.shared_arena() == nullptr);
  });
}

// A failed rank releases the others from shared_arena()'s collective allocation and from the
// arena's flag waits.
TEST(inproc, failure_releases_shared_memory_waits) {
  for (bool fail_before_allocating : {true, false}) {
    std::atomic<int> released{0};
    const Failure f = run_expecting_failure(
        4,
        [&](Communicator& comm) {
          if (comm.rank() == 3) {
            if (!fail_before_allocating) comm.shared_arena();
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            throw zcoll::Error("rank 3 gives up");
          }
          try {
            zcoll::SharedArena* a = comm.shared_arena();
            a->publish(comm.rank(), 1, 1);
            a->wait_all(1, 1);  // rank 3 never publishes
          } catch (const zcoll::Error&) {
            released.fetch_add(1);
            throw;
          }
        },
        ztest::test_options());
    ztest::Context ctx(fail_before_allocating ? "failing before shared_arena()"
                                              : "failing after shared_arena()");
    CHECK(f.thrown);
    CHECK_EQ(f.rank, 3);
    CHECK_EQ(released.load(), 3);
  }
}

// oversubscribed(): more ranks than CPUs; the arena's waits then yield early.
TEST(inproc, oversubscribed) {
  InProcOptions o = ztest::test_options();
  o.cpus = 2;
  ON_RANKS(2, o, [&](Communicator& comm) {
    CHECK(!comm.oversubscribed());
    CHECK(!comm.shared_arena()->yield_when_waiting);
  });
  ON_RANKS(3, o, [&](Communicator& comm) {
    CHECK(comm.oversubscribed());
    CHECK(comm.shared_arena()->yield_when_waiting);
  });
}

// Bad peers are the caller's mistake; an unknown request handle is an invariant failure.
TEST(inproc, bad_arguments) {
  ON_RANKS(2, ztest::test_options(), [&](Communicator& comm) {
    int x = 0;
    CHECK_THROWS(comm.isend(&x, sizeof x, 2, 0), std::invalid_argument);
    CHECK_THROWS(comm.irecv(&x, sizeof x, -1, 0), std::invalid_argument);
    CHECK_THROWS(comm.irecv(nullptr, 4, 0, 0), std::invalid_argument);
    Request bogus;
    bogus.handle = 12345;
    bogus.active = true;
    CHECK_THROWS(comm.wait(bogus), zcoll::Error);
    CHECK(!comm.has_native_allreduce());
    CHECK_THROWS(comm.native_allreduce(&x, &x, 1, zcoll::DType::kInt32, zcoll::ReduceOp::kSum),
                 std::invalid_argument);
  });
  CHECK_THROWS(zcoll::InProcGroup(0), std::invalid_argument);
}

// The node map (Communicator::node_of): labels renumbered in order of each node's lowest rank,
// the same on every rank; the shm path only when every rank is on one node.
TEST(inproc, nodes) {
  InProcOptions o = ztest::test_options();
  ON_RANKS(3, o, [&](Communicator& comm) {
    CHECK_EQ(comm.node_count(), 1);
    CHECK_EQ(comm.node_of(2), 0);
    CHECK_EQ(comm.local_ranks().size(), 3u);
    CHECK(comm.has_shared_arena());
  });
  o.nodes = {7, 3, 7, 3, 9};
  ON_RANKS(5, o, [&](Communicator& comm) {
    CHECK_EQ(comm.node_count(), 3);
    const std::vector<int> want_nodes = {0, 1, 0, 1, 2};
    for (int r = 0; r < 5; ++r) CHECK_EQ(comm.node_of(r), want_nodes[r]);
    const std::vector<std::vector<int>> want_local = {{0, 2}, {1, 3}, {0, 2}, {1, 3}, {4}};
    CHECK(comm.local_ranks() == want_local[comm.rank()]);
    CHECK(!comm.has_shared_arena());
    CHECK(comm.shared_arena() == nullptr);
    CHECK_THROWS(comm.node_of(5), std::invalid_argument);
  });
  o.nodes = {1, 2};
  CHECK_THROWS(zcoll::InProcGroup(3, o), std::invalid_argument);
}
