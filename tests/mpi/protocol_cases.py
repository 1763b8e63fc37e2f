"""Cases that pass and fail in every way the protocol (tests/harness.py) reports, for
tests/test_mpi_util.py: run on 2 ranks, all cases in file order; with --fail-after, only the
passing case, and then the job fails in its teardown."""

from harness import WORLD, Checks, option, run_cases


def case_passes(ck: Checks):
    for i in range(3):
        ck.check(i < 3)
    ck.same_on_all_ranks("the same bytes", b"zcoll")
    ck.raises(ValueError, lambda: int("x"), "invalid literal")


def case_fails_one_check_of_three(ck: Checks):
    ck.check(True)
    ck.check(WORLD.rank != 1, "the odd one out", "rank 1 fails this check")
    ck.check(True)


def case_checks_nothing_on_rank_1(ck: Checks):
    if WORLD.rank == 0:
        ck.check(True)


def case_differs_between_ranks(ck: Checks):
    ck.same_on_all_ranks("the rank's own bytes", bytes([WORLD.rank]))


def case_raises_the_wrong_exception(ck: Checks):
    ck.raises(ValueError, lambda: [][0], "anything")


def case_raises_on_rank_1(ck: Checks):
    ck.check(True)
    if WORLD.rank == 1:
        raise RuntimeError("rank 1 raised on purpose")
    WORLD.Barrier()  # rank 0 waits here until the job is aborted


def case_never_reached(ck: Checks):
    ck.check(True)


def failing_teardown():
    raise RuntimeError("the teardown failed on purpose")


if __name__ == "__main__":
    run_cases(globals(), teardown=failing_teardown if option("fail-after") is not None else None)
