// Deliberate failures: what a failure report looks like, checked by the pytest file test_cpp.py. Runs
// only when named ("selftest.*"), never in the default run.
#include <stdexcept>

#include "ztest.h"

TEST(selftest, failing_checks) {
  const int one = 1;
  CHECK_EQ(one, 2);
  CHECK_THROWS((void)one, std::invalid_argument);
  ztest::Context ctx("the context");
  CHECK(one == 3);
}

TEST(selftest, failing_rank) {
  ON_RANKS(3, ztest::test_options(), [](zcoll::Communicator& comm) {
    if (comm.rank() == 1) throw std::runtime_error("rank 1 fails on purpose");
    int x = 0;
    zcoll::Request r = comm.irecv(&x, sizeof x, 1, 0);  // released by the failure
    comm.wait(r);
  });
}
