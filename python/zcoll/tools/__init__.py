"""The ``zcoll`` command (cli): ``info``, ``run`` (launcher), ``probe`` (probe_command) and
``report`` (report_command)."""
