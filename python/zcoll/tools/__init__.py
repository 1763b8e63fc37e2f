"""The ``zcoll`` command (cli): ``info``, ``run`` (launcher), ``probe`` (probe_command) and
``report`` (report_command); and what the tests and benchmarks run on: jobs under a deadline that
kills their process tree (proc), an emulated multi-node cluster (testbed, ``python -m
zcoll.tools.testbed``) and a rate-limited loopback (netns) in network namespaces, the
zcoll_*_perf binaries' tables (perf_table), inputs exact in any reduction order (exact_inputs),
and compression="auto"'s prediction errors from its log (auto_log)."""
