"""The CUDA kernels (csrc/cuda) compile where nvcc is installed, GPU or not, and give results
bit-identical to the CPU scalar reference where a GPU is present.

Configures a separate CMake build (build/pytest-cuda, kept for incremental reruns) with
-DZCOLL_ENABLE_CUDA=ON -DZCOLL_BUILD_PYTHON=OFF for one architecture (sm_90, or CMake's CUDAARCHS
variable), builds the zcoll_cuda library and the zcoll_cuda_check program, and runs the latter:
it exits 0 when the GPU results equal the CPU's, 1 on a mismatch, and 77 when no CUDA device is
visible (then the comparison is skipped, saying so; the build itself is still tested).
"""

import glob
import os
import shutil
from pathlib import Path

import pytest
from mpi_util import ROOT, run

BUILD = ROOT / "build" / "pytest-cuda"
NO_CUDA_DEVICE = 77  # zcoll_cuda_check's exit status without a GPU (csrc/cuda/zcoll_cuda_check.cc)
# The C++ side unoptimised (the .cu files as in a Release build): the core compiles ~3x faster at
# -O0 and its -O3 code is what the rest of the suite runs; the CPU reference the GPU is compared
# with computes the same bits at -O0 (-ffp-contract=off, no reassociation at any level).
UNOPTIMISED_CXX = [
    "-DCMAKE_BUILD_TYPE=Debug",
    "-DCMAKE_CXX_FLAGS_DEBUG=-O0",
    "-DCMAKE_CUDA_FLAGS_DEBUG=-O3 -DNDEBUG",
]


def find_nvcc():
    nvcc = shutil.which("nvcc")
    if nvcc:
        return nvcc
    found = sorted(glob.glob("/usr/local/cuda*/bin/nvcc"))
    return found[-1] if found else None


pytestmark = pytest.mark.skipif(
    find_nvcc() is None, reason="nvcc not found on PATH or in /usr/local/cuda*/bin (install the CUDA toolkit)"
)


def run_ok(cmd, timeout):
    rc, out = run(cmd, timeout=timeout, cwd=ROOT)
    assert rc == 0, f"{' '.join(map(str, cmd))} exited {rc}:\n{out[-12000:]}"
    return out


@pytest.fixture(scope="module")
def cuda_build() -> Path:
    cmake = shutil.which("cmake")
    assert cmake, "cmake not found"
    gen = ["-G", "Ninja"] if shutil.which("ninja") and not (BUILD / "Makefile").exists() else []
    arch = [] if os.environ.get("CUDAARCHS") else ["-DCMAKE_CUDA_ARCHITECTURES=90"]
    run_ok(
        [
            cmake,
            "-S",
            ROOT,
            "-B",
            BUILD,
            *gen,
            "-DZCOLL_ENABLE_CUDA=ON",
            "-DZCOLL_BUILD_PYTHON=OFF",
            "-DZCOLL_BUILD_BENCH=OFF",
            *UNOPTIMISED_CXX,
            *arch,
            f"-DCMAKE_CUDA_COMPILER={find_nvcc()}",
        ],
        timeout=300,
    )
    run_ok([cmake, "--build", BUILD, "--target", "zcoll_cuda", "zcoll_cuda_check"], timeout=900)
    return BUILD / "csrc" / "cuda"


@pytest.mark.timeout(1200)
def test_cuda_kernels_build(cuda_build):
    assert (cuda_build / "libzcoll_cuda.a").exists()
    assert (cuda_build / "zcoll_cuda_check").exists()


@pytest.mark.timeout(1200)
def test_cuda_kernels_equal_cpu_on_a_gpu(cuda_build):
    rc, out = run([cuda_build / "zcoll_cuda_check"], timeout=900)
    if rc == NO_CUDA_DEVICE:
        pytest.skip(
            f"no CUDA device visible to zcoll_cuda_check (exit {rc}); the GPU-vs-CPU comparison needs a "
            f"machine with a GPU: {out.strip()[-300:]}"
        )
    assert rc == 0 and "PASS" in out, out[-12000:]
