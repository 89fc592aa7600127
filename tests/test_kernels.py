"""The CUDA kernels, checked without a GPU: nvcc compiles them for sm_80 and sm_90, and the host compiler runs
them through cuda_emulation.h on poisoned random inputs, byte-compared with their NumPy twins."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minialloc.cuda_device import cuda_unavailable_reason
from minialloc.kernels import KERNEL_DIR, KERNELS
from minialloc.kernels import reference as ref
from minialloc.kernels.check import compare_with_reference
from minialloc.kernels.emulation import EmulatedKernels, compile_emulation, find_compiler, translation_unit

NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).exists()), None)
ORDERS = {"in order": 0, "reversed": 1, "shuffled": 987654321}
_SIGNATURE = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\)')
_KINDS = {"unsigned long long": "u64", "unsigned int": "u32"}


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    try:
        find_compiler()
    except RuntimeError as e:
        pytest.skip(str(e))
    return tmp_path_factory.mktemp("emulation")


@pytest.fixture(scope="module", params=list(ORDERS.values()), ids=list(ORDERS))
def kernels(request, build_dir) -> EmulatedKernels:
    return EmulatedKernels.build(build_dir, order=request.param)


def poison(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


# -- the sources ---------------------------------------------------------------------------------------------------
def test_specs_match_the_sources():
    """KERNELS (what the runners pass) and the .cu signatures (what the kernels take) must agree."""
    found = {}
    for path in KERNEL_DIR.glob("*.cu"):
        for name, params in _SIGNATURE.findall(path.read_text()):
            kinds = []
            for param in params.split(","):
                ctype, pname = param.strip().rsplit(" ", 1)
                kinds.append((pname.lstrip("*"), "ptr" if "*" in ctype + pname else _KINDS[ctype]))
            found[name] = (path.name, tuple(kinds))
    assert found == {name: (spec.source, spec.params) for name, spec in KERNELS.items()}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_kernel_compiles_to_ptx(arch, tmp_path):
    if NVCC is None:
        pytest.skip("nvcc is not installed here (CI has it): cannot check that the kernels compile for the GPU")
    from minialloc.kernels.gpu import kernel_source

    combined = tmp_path / "all_kernels.cu"  # what CuPy compiles: every kernel in one translation unit
    combined.write_text(kernel_source())
    sources = [spec.path for spec in KERNELS.values()] + [combined]
    result = subprocess.run([NVCC, "-ptx", f"-arch={arch}", *map(str, sources)], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for spec in KERNELS.values():
        for ptx in (tmp_path / spec.path.with_suffix(".ptx").name, tmp_path / "all_kernels.ptx"):
            text = ptx.read_text()
            assert f".target {arch}" in text
            assert re.search(rf"\.entry {spec.name}\(", text), f"{spec.name} missing from {ptx.name}"


def test_kernels_and_header_compile_cleanly_as_host_cpp(build_dir):
    """-Wall -Wextra -Werror: a narrowing, an unused variable or a sign mix in a kernel fails here."""
    unit = translation_unit({name: spec.path for name, spec in KERNELS.items()})
    result = subprocess.run([find_compiler(), "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                             "-x", "c++", "-"], input=unit, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# -- emulation against the twins -----------------------------------------------------------------------------------
def test_random_cases_match_reference_under_every_thread_order(kernels):
    checks = compare_with_reference(kernels, seed=kernels.order % 1000, rounds=40)
    assert [c.kernel for c in checks] == ["fill_pattern", "guard_check", "block_copy", "move", "copy_blocks"]
    for c in checks:
        assert c.cases == 40
        assert c.max_abs_error == 0, c.first_failure


@pytest.mark.parametrize("nbytes", [0, 1, 3, 31, 32, 33, 255, 256, 257, 1000])
@pytest.mark.parametrize("shape", [(1, 1), (1, 32), (3, 32), (None, None), (64, 256)])
def test_fill_at_block_boundaries(kernels, nbytes, shape):
    grid, block = shape
    buf = poison(nbytes + 10)
    want = buf.copy()
    kernels.fill(buf, 5, nbytes, 0xEFBEADDE, grid=grid, block=block)
    ref.fill(want, 5, nbytes, 0xEFBEADDE)
    assert np.array_equal(buf, want)
    assert buf[5:5 + min(nbytes, 4)].tobytes() == b"\xde\xad\xbe\xef"[:nbytes]  # DEADBEEF in memory order


def test_guard_check_reports_the_first_of_many_corruptions(kernels):
    buf = poison(3000)
    ref.fill(buf, 100, 2000, ref.POISON)
    assert kernels.guard_check(buf, 100, 2000, ref.POISON, grid=4, block=8) == -1
    for at in (1900, 105, 700):
        buf[100 + at] = 0
    # whichever thread finds its mismatch first, atomicMin keeps the smallest offset
    assert kernels.guard_check(buf, 100, 2000, ref.POISON, grid=4, block=8) == 105
    assert ref.guard_check(buf, 100, 2000, ref.POISON) == 105


def test_block_copy_refuses_overlap_by_address(kernels):
    buf = poison(100)
    for fn in (kernels.block_copy, ref.block_copy):
        with pytest.raises(ValueError, match="overlap"):
            fn(buf, 10, buf, 20, 15)
        with pytest.raises(ValueError, match="overlap"):  # two views of one buffer: judged on addresses
            fn(buf[10:], 0, buf, 15, 10)
        fn(buf, 10, buf, 20, 10)  # touching, not overlapping: allowed


def test_why_block_copy_forbids_overlap(build_dir):
    """Launched directly on overlapping ranges, the kernel's result depends on thread order: the reason the
    wrappers refuse overlap and move() goes through move_plan."""
    results = []
    for order in ORDERS.values():
        k = EmulatedKernels.build(build_dir, order=order)
        buf = np.arange(64, dtype=np.uint8)
        k._launch("block_copy", 1, 64, [buf, 0, buf, 8, 56])
        results.append(buf.tobytes())
    want = np.arange(64, dtype=np.uint8)
    ref.move(want, 0, 8, 56)
    assert results[0] == want.tobytes()  # in order happens to work for a downward move...
    assert results[1] != want.tobytes()  # ...reversed does not


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(0, 300), st.integers(0, 300))
def test_move_plan_is_memmove(dst, src, nbytes):
    plan = ref.move_plan(dst, src, nbytes)
    buf = poison(700, seed=dst * 1000 + src)
    want = buf.copy()
    ref.move(want, dst, src, nbytes)
    for d, s, n in plan:
        assert not ref.ranges_overlap(d, s, n)
        buf[d:d + n] = buf[s:s + n]  # each chunk as a plain copy: only correct if the plan is
    assert np.array_equal(buf, want)
    gap = abs(dst - src)
    assert len(plan) == (0 if nbytes == 0 or gap == 0 else -(-nbytes // gap))


def test_argument_checks_are_shared(kernels):
    buf = poison(64)
    cache = np.zeros((8, 16), np.uint8)
    bad_calls = [
        (lambda k: k.fill(buf, 60, 5, 0), ValueError, "past the end"),
        (lambda k: k.fill(buf, 0, 5, 2**32), ValueError, "pattern"),
        (lambda k: k.fill(buf.astype(np.int32), 0, 5, 0), TypeError, "uint8"),
        (lambda k: k.guard_check(buf, -1, 5, 0), ValueError, "offset"),
        (lambda k: k.copy_blocks(cache, [(0, 1), (2, 1)]), ValueError, "same destination"),
        (lambda k: k.copy_blocks(cache, [(0, 1), (1, 2)]), ValueError, "also a source"),
        (lambda k: k.copy_blocks(cache, [(0, 8)]), ValueError, "out of range"),
        (lambda k: k.copy_blocks(np.zeros((8, 6), np.uint8), [(0, 1)]), ValueError, "multiple of 4"),
    ]
    for call, error, match in bad_calls:
        for runner in (kernels, ref):
            with pytest.raises(error, match=match):
                call(runner)
    assert np.count_nonzero(cache) == 0


def test_copy_blocks_with_fewer_cuda_blocks_than_pairs(kernels):
    cache = np.random.default_rng(3).integers(0, 256, (40, 100), dtype=np.uint8)
    pairs = [(i, 20 + i) for i in range(0, 20, 2)] + [(0, 39)]
    want = cache.copy()
    ref.copy_blocks(want, pairs)
    kernels.copy_blocks(cache, pairs, grid=3, block=7)  # 3 CUDA blocks stride over 11 pairs, 7 threads over 25 words
    assert np.array_equal(cache, want)


# -- the checks can fail ---------------------------------------------------------------------------------------------
BUGGY = """
extern "C" __global__ void fill_pattern(unsigned char* buf, unsigned long long offset,
                                        unsigned long long nbytes, unsigned int pattern) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;  // no grid-stride loop
    if (i < nbytes) buf[offset + i] = (unsigned char)(pattern >> (8u * (unsigned int)(i & 3ull)));
}
extern "C" __global__ void guard_check(const unsigned char* buf, unsigned long long offset,
                                       unsigned long long nbytes, unsigned int pattern,
                                       unsigned long long* first_bad) {
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < nbytes; i += stride)
        if (buf[offset + i] != (unsigned char)(pattern >> (8u * (unsigned int)(i & 3ull)))) {
            *first_bad = i;  // a plain store instead of atomicMin: the last thread to write wins
            return;
        }
}
"""


def test_the_comparison_catches_a_missing_stride_and_a_missing_atomic(build_dir, tmp_path):
    source = tmp_path / "buggy.cu"
    source.write_text(BUGGY)
    sources = {name: spec.path for name, spec in KERNELS.items()} | {"fill_pattern": source, "guard_check": source}
    lib = compile_emulation(sources, build_dir)
    checks = {order: {c.kernel: c for c in compare_with_reference(EmulatedKernels(lib, order=order), rounds=30)}
              for order in ORDERS.values()}
    assert all(c["fill_pattern"].max_abs_error > 0 for c in checks.values())  # small grids leave bytes unwritten
    assert checks[ORDERS["reversed"]]["guard_check"].max_abs_error > 0  # a later offset overwrote the first


# -- the GPU runner --------------------------------------------------------------------------------------------------
def test_gpu_runner_is_lazy():
    """Building a CupyKernels compiles nothing and needs no GPU; the module exists only after a launch."""
    from minialloc.kernels import gpu

    k = gpu.CupyKernels(block=128)
    assert k.block == 128 and gpu._module is None
    assert all(f"void {name}(" in gpu.kernel_source() for name in KERNELS)


@pytest.mark.skipif(cuda_unavailable_reason() is not None, reason="needs a CUDA GPU")
def test_gpu_kernels_match_reference():
    from minialloc.kernels.gpu import CupyKernels

    for c in compare_with_reference(CupyKernels(), seed=5, rounds=16, max_size=1 << 20):
        assert c.max_abs_error == 0, c.first_failure
