#!/usr/bin/env bash
# zcoll's two entry points on a fresh machine. Each one sets itself up (idempotently): a local
# virtual environment in .venv, the MPICH wheel from PyPI, mpi4py, and zcoll built from this
# checkout (incremental rebuilds through build/).
#
#   ./dev.sh bench   the allreduce benchmark, every algorithm side by side with MPI_Allreduce,
#                    2 ranks, 4 KiB to 64 MiB
#   ./dev.sh test    the whole test suite
#
# Extra arguments go to the benchmark binary or to pytest.
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating $VENV" >&2
    python3 -m venv "$VENV"
  fi
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
  if ! python -c "import mpi4py, numpy, pytest, pytest_timeout, hypothesis, torch, sklearn, matplotlib, expecttest, starlette, uvicorn, prometheus_client, plotly, selenium" 2>/dev/null \
     || [ ! -x "$VENV/bin/mpicc" ]; then
    echo "== installing build and test requirements into $VENV" >&2
    python -m pip install -q --upgrade pip
    python -m pip install -q "mpich" "mpi4py>=4.0" "numpy>=1.24" "pytest>=8" pytest-timeout "hypothesis>=6" \
      "scikit-build-core>=0.10" "pybind11>=2.12" ninja cmake "torch==2.13.0" scikit-learn matplotlib expecttest \
      "starlette>=0.37" "uvicorn>=0.29" "prometheus_client>=0.20" "plotly>=5" "selenium>=4.20" \
      2>&1 | { grep -v "^WARNING: Location" || true; } >&2
  fi
  echo "== building zcoll" >&2
  # --no-build-isolation: reuse the venv's build tools and keep build/ for incremental rebuilds.
  exec 9>"${TMPDIR:-/tmp}/zcoll-build-$(id -u).lock"; flock 9  # one build at a time per machine
  python -m pip install -q --no-build-isolation --no-deps . 2>&1 | { grep -v "^WARNING: Location" || true; } >&2 || {
    echo "build failed: rerun with 'pip install -v --no-build-isolation .' to see why" >&2; exit 1; }
  exec 9>&-
}

case "${1:-}" in
  bench)
    shift
    setup
    exec mpirun -n 2 zcoll_allreduce_perf -b 4K -e 64M -f 2 -n 50 -w 5 -a all "$@"
    ;;
  test)
    shift
    setup
    exec python -m pytest -q "$@"
    ;;
  *)
    echo "usage: ./dev.sh bench [benchmark flags] | ./dev.sh test [pytest args]" >&2
    exit 2
    ;;
esac
