"""The CUDA kernels, checked without a GPU: nvcc compiles them for sm_80 and sm_90, and the host compiler runs
them through cuda_emulation.h on poisoned random inputs, byte-compared with their NumPy twins (the attention
kernels: compared in relative error with the float64 twins and with dense attention)."""

from __future__ import annotations

import ctypes
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
from minialloc.kernels.check import (
    ATTENTION_TOLERANCE,
    compare_attention_with_reference,
    compare_with_reference,
    random_attention_case,
)
from minialloc.kernels.emulation import (
    EmulatedKernels,
    EmulatedLaunchError,
    compile_emulation,
    find_compiler,
    translation_unit,
)
from minialloc.paging import copy_blocks_reference

NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).exists()), None)
ORDERS = {"in order": 0, "reversed": 1, "shuffled": 987654321}
_SIGNATURE = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\)')
_KINDS = {"unsigned long long": "u64", "unsigned int": "u32", "float": "f32"}
SOURCES = list(dict.fromkeys(spec.path for spec in KERNELS.values()))  # paged_attention.cu holds two kernels


@pytest.fixture(scope="module")
def build_dir() -> Path | None:
    """None: compile_emulation's own cache, as EmulatedKernels.build() uses it. Each library there is named after
    a hash of its sources, the header, the compiler and its flags, so an edited kernel is compiled again and an
    unchanged one is not compiled on every run (a fresh folder per session cost seconds of each `make check`)."""
    try:
        find_compiler()
    except RuntimeError as e:
        pytest.skip(str(e))
    return None


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
    sources = [*SOURCES, combined]
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


def test_copy_waves_run_an_ordered_copy_list_as_parallel_launches(kernels):
    """The block manager's ordered lists (chains, a source reused as a destination, a destination written twice)
    through copy_waves and the kernel equal copy_blocks_reference, which copies one pair after another."""
    rng = np.random.default_rng(kernels.order)
    for _ in range(30):
        cache = rng.integers(0, 256, (7, 12), dtype=np.uint8)
        pairs = [tuple(int(x) for x in rng.integers(0, 7, 2)) for _ in range(int(rng.integers(0, 9)))]
        want = cache.copy()
        copy_blocks_reference(want, pairs)
        launches = kernels.copy_blocks_in_order(cache, pairs, grid=2, block=3)
        assert np.array_equal(cache, want), pairs
        assert launches == len(ref.copy_waves(pairs)) <= len(pairs)
    chain = [(0, 1), (1, 2), (2, 3)]  # a fork of a fork of a fork: every copy holds block 0
    assert ref.copy_waves(chain) == [[(0, 1)], [(1, 2)], [(2, 3)]]
    assert ref.copy_waves([(0, 1), (2, 3), (0, 4), (5, 5)]) == [[(0, 1), (2, 3), (0, 4)]]  # (5, 5): nothing


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=12))
def test_copy_waves_are_legal_and_sequential(pairs):
    waves = ref.copy_waves(pairs)
    for wave in waves:
        ref.check_pairs(6, wave)  # what the kernel accepts: raises otherwise
    cache = np.arange(6 * 4, dtype=np.uint8).reshape(6, 4)
    want, got = cache.copy(), cache.copy()
    copy_blocks_reference(want, pairs)
    for wave in waves:
        ref.copy_blocks(got, wave)  # the kernel's twin: parallel semantics
    assert np.array_equal(got, want)


# -- attention --------------------------------------------------------------------------------------------------------
def test_attention_matches_reference_and_dense_under_every_thread_order(kernels):
    checks = compare_attention_with_reference(kernels, seed=100 + kernels.order % 1000, rounds=14)
    assert [c.kernel for c in checks] == ["paged_attention", "paged_attention vs dense attention", "dense_attention"]
    for c in checks:
        assert c.cases == 14 and c.passed, c.first_failure
        assert c.max_rel_error < ATTENTION_TOLERANCE


@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("block_size", [1, 7, 16])
def test_paged_attention_over_long_contexts_and_grouped_heads(kernels, num_heads, num_kv_heads, block_size):
    """Contexts of a few hundred tokens (many rounds of the token loop) over tables scattered through the cache,
    against the twin and against dense attention over the same K and V laid out contiguously."""
    rng = np.random.default_rng(block_size * 10 + num_heads)
    head_dim, num_blocks = 64, 400
    lens = np.array([300, 1, 257])
    tables = np.stack([rng.permutation(num_blocks)[: -(-300 // block_size)] for _ in lens])
    kv = rng.standard_normal((num_blocks, 2, block_size, num_kv_heads, head_dim), dtype=np.float32)
    q = rng.standard_normal((len(lens), num_heads, head_dim), dtype=np.float32)
    out = np.full(q.shape, np.nan, np.float32)
    kernels.paged_attention(q, kv, tables, lens, 0.125, out=out)
    assert ref.relative_error(out, ref.paged_attention(q, kv, tables, lens, 0.125)) < ATTENTION_TOLERANCE
    k = np.stack([np.concatenate([kv[b, 0] for b in table])[:300] for table in tables])
    v = np.stack([np.concatenate([kv[b, 1] for b in table])[:300] for table in tables])
    assert ref.relative_error(out, ref.dense_attention(q, k, v, lens, 0.125)) < ATTENTION_TOLERANCE


def test_attention_argument_checks_are_shared(kernels):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 8), dtype=np.float32)
    kv = rng.standard_normal((6, 2, 4, 2, 8), dtype=np.float32)
    tables = np.array([[0, 1, 5], [2, 3, -1]])  # -1 past sequence 1's context: never read, allowed
    lens = [9, 8]
    bad_calls = [
        (lambda r: r.paged_attention(q, kv, tables, [0, 3], 1.0), ValueError, "context length"),
        (lambda r: r.paged_attention(q, kv, tables, [13, 3], 1.0), ValueError, "context length"),
        (lambda r: r.paged_attention(q, kv, [[0, 1, 6], [2, 3, 4]], lens, 1.0), ValueError, "outside"),
        (lambda r: r.paged_attention(q, kv, [[0, 1, 5], [2, -1, 4]], lens, 1.0), ValueError, "outside"),
        (lambda r: r.paged_attention(q.astype(np.float64), kv, tables, lens, 1.0), TypeError, "float32"),
        (lambda r: r.paged_attention(q[:, :3], kv, tables, lens, 1.0), TypeError, "contiguous"),
        (lambda r: r.paged_attention(np.ascontiguousarray(q[:, :3]), kv, tables, lens, 1.0), ValueError,
         "multiple of num_kv_heads"),
        (lambda r: r.paged_attention(q, kv[..., :4].copy(), tables, lens, 1.0), ValueError, "head_dim"),
        (lambda r: r.dense_attention(q, kv[:2, 0], kv[:2, 1].copy(), lens, 1.0), TypeError, "contiguous"),
        (lambda r: r.dense_attention(q, kv[:2, 0].copy(), kv[:2, 1].copy(), [5, 3], 1.0), ValueError, "max_len"),
    ]
    for call, error, match in bad_calls:
        for runner in (kernels, ref):
            with pytest.raises(error, match=match):
                call(runner)
    out = np.zeros_like(q)
    with pytest.raises(ValueError, match="whole warps"):
        kernels.paged_attention(q, kv, tables, lens, 1.0, block=48)
    with pytest.raises(ValueError, match="shaped like q"):
        kernels.paged_attention(q, kv, tables, lens, 1.0, out=out[:1])
    assert kernels.paged_attention(q, kv, tables, lens, 1.0, out=out) is out
    assert ref.relative_error(out, ref.paged_attention(q, kv, tables, lens, 1.0)) < ATTENTION_TOLERANCE


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


MUTATIONS = {
    "reads one token past the context": ("const bool active = t < len;", "const bool active = t <= len;"),
    "reads sequence 0's block table": ("tables[s * max_blocks + t / block_size]", "tables[t / block_size]"),
    "reads the wrong slot of a block": ("t % block_size) * num_kv_heads", "(t + 1) % block_size) * num_kv_heads"),
    "drops the last group's tokens": ("for (unsigned int base = 0; base < len; base += groups)",
                                      "for (unsigned int base = 0; base + groups < len; base += groups)"),
    "forgets the running-max rescale": ("acc[j] = acc[j] * rescale + p * vr[j];", "acc[j] = acc[j] + p * vr[j];"),
    "merges the warps before they wrote": ("        __syncthreads();\n        // merge the warps",
                                           "        // merge the warps"),
}


@pytest.mark.parametrize("bug", list(MUTATIONS))
def test_the_attention_comparison_catches_a_broken_kernel(build_dir, tmp_path, bug):
    old, new = MUTATIONS[bug]
    text = KERNELS["paged_attention"].path.read_text()
    assert old in text
    source = tmp_path / "paged_attention.cu"
    source.write_text(text.replace(old, new))
    lib = compile_emulation({"paged_attention": source, "dense_attention": source}, build_dir)
    check = compare_attention_with_reference(EmulatedKernels(lib, order=ORDERS["shuffled"]), seed=3, rounds=6)[0]
    assert check.max_rel_error > 1e-3 and not check.passed, bug


COOPERATION_BUGS = """
extern "C" __global__ void divergent_shuffle(float* out) {
    float x = (float)threadIdx.x;
    if (threadIdx.x < 16) x += __shfl_xor_sync(0xffffffffu, x, 1);  // half the warp: undefined on a GPU
    out[threadIdx.x] = x;
}
extern "C" __global__ void barrier_after_exit(float* out) {
    if (threadIdx.x == 0) return;  // one thread leaves, the others wait for it at the barrier
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}
extern "C" __global__ void shuffle_everyone(float* out) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 5);
}
"""


def test_emulation_refuses_what_would_hang_or_be_undefined_on_a_gpu(build_dir, tmp_path):
    source = tmp_path / "bugs.cu"
    source.write_text(COOPERATION_BUGS)
    unit = [f'#include "{KERNEL_DIR / "cuda_emulation.h"}"', f'#include "{source}"',
            "MINIALLOC_EMULATE_COOPERATIVE(divergent_shuffle)", "MINIALLOC_EMULATE_COOPERATIVE(barrier_after_exit)",
            "MINIALLOC_EMULATE_COOPERATIVE(shuffle_everyone)",
            # the same shuffle launched the plain way (threads one after another), exported under another name
            'extern "C" int emu_plain(unsigned int g, unsigned int b, unsigned long long o, void** a) {',
            "    emu::launch_error = nullptr;",
            "    emu::launch(shuffle_everyone, g, b, o, a);",
            "    return emu::launch_error == nullptr ? 0 : 1;",
            "}"]
    library = tmp_path / "bugs.so"
    result = subprocess.run([find_compiler(), "-std=c++17", "-shared", "-fPIC", "-x", "c++", "-", "-o",
                             str(library)], input="\n".join(unit) + "\n", capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lib = ctypes.CDLL(str(library))
    lib.emu_last_error.restype = ctypes.c_char_p
    out = np.zeros(64, np.float32)
    holder = ctypes.c_void_p(out.ctypes.data)
    args = (ctypes.c_void_p * 1)(ctypes.addressof(holder))
    for name in ("divergent_shuffle", "barrier_after_exit"):
        assert getattr(lib, f"emu_{name}")(1, 32, 0, args) == 1
        assert b"never reaches" in lib.emu_last_error()
    assert lib.emu_shuffle_everyone(2, 64, 7, args) == 0
    assert out.tolist() == [float(t ^ 5) for t in range(64)]  # lane ^ 5, within each warp of each block
    assert lib.emu_plain(1, 32, 0, args) == 1
    assert b"not launched cooperatively" in lib.emu_last_error()


def test_a_cooperative_kernel_registered_as_plain_raises(build_dir, tmp_path, monkeypatch):
    """The Python runner turns a refused launch into EmulatedLaunchError, naming the kernel and the reason."""
    from dataclasses import replace

    from minialloc import kernels as kernels_pkg

    monkeypatch.setitem(kernels_pkg.KERNELS, "paged_attention",
                        replace(KERNELS["paged_attention"], cooperative=False))
    lib = compile_emulation({"paged_attention": KERNELS["paged_attention"].path}, build_dir)
    monkeypatch.undo()
    case = random_attention_case(np.random.default_rng(0))
    with pytest.raises(EmulatedLaunchError, match=r"paged_attention<<<.*not launched cooperatively"):
        EmulatedKernels(lib).paged_attention(case.q, case.kv_cache, case.block_tables, case.context_lens, 1.0)



def test_gpu_checks_attention_benchmark_runs_on_the_emulation(build_dir):
    """The attention benchmark (workload, timing; gpu_check's bandwidth and overhead rows) only runs for real on a
    GPU; here the same code runs on the CPU emulation with a wall-clock timer, so a slip in it shows before then."""
    from minialloc.kernels.bench import attention_benchmark, attention_workload
    from minialloc.timing import once
    from tools import gpu_check

    def seconds(fn):
        return once(fn)[1]

    w = attention_workload(np, 3, 2, 8, 4, (5, 13), seed=1)
    for s, n in enumerate(w["lens"]):  # the contiguous copy holds each position's slot, read through the table
        for pos in range(n):
            assert np.array_equal(w["k"][s, pos], w["kv"][w["tables"][s, pos // 4], 0, pos % 4])
            assert np.array_equal(w["v"][s, pos], w["kv"][w["tables"][s, pos // 4], 1, pos % 4])
    used = np.concatenate([w["tables"][s, : -(-n // 4)] for s, n in enumerate(w["lens"])])
    assert sorted(used.tolist()) == list(range(w["kv"].shape[0]))  # every block of the cache, each once
    kv_read = sum(w["k"][s, :n].nbytes + w["v"][s, :n].nbytes for s, n in enumerate(w["lens"]))
    assert w["kv_bytes"] == kv_read + 2 * w["q"].nbytes + 4 * (w["tables"].size + 3)  # + out, int32 metadata
    bench = attention_benchmark(EmulatedKernels.build(build_dir), seconds, np.copyto, num_seqs=3, num_heads=2,
                                head_dim=8, block_size=4, len_range=(5, 40), copy_bytes=1 << 16)
    assert bench.agreement < ATTENTION_TOLERANCE and bench.paged_s > 0 and bench.dense_s > 0
    assert 5 <= bench.lens[0] <= bench.lens[1] <= 40 and bench.share == bench.bandwidth / bench.copy_bytes_per_s
    rows = gpu_check.attention_bench_rows(bench)
    assert [r.check for r in rows] == ["paged_attention bandwidth vs device-to-device copy",
                                       "paged_attention time vs dense attention"]
    assert all(r.result in ("PASS", "FAIL") and "GB/s" in rows[0].detail for r in rows)
    slow = bench._replace(paged_s=bench.dense_s * 1.3)
    assert gpu_check.attention_bench_rows(slow)[1].result == "FAIL"  # +30%: worse than the paper


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


@pytest.mark.skipif(cuda_unavailable_reason() is not None, reason="needs a CUDA GPU")
def test_gpu_attention_matches_reference():
    from minialloc.kernels.gpu import CupyKernels

    for c in compare_attention_with_reference(CupyKernels(), seed=5, rounds=12, max_context=900, max_seqs=6):
        assert c.passed, c.first_failure


def test_the_gpu_tests_attention_cases_pass_on_the_emulation(build_dir):
    """The GPU attention test's own cases (seed 5, contexts up to 900, head_dim down to 1) on the CPU emulation, at the
    same tolerance: the kernel is within it of the float64 twins. A twin computed in float32 is not a reference: on
    these cases it is itself off by more than the tolerance somewhere, which is why every twin computes in float64."""
    from minialloc.kernels.reference import dense_attention_reference, relative_error

    emulated = EmulatedKernels.build(build_dir, order=ORDERS["shuffled"])
    checks = compare_attention_with_reference(emulated, seed=5, rounds=12, max_context=900, max_seqs=6)
    assert checks and all(c.passed for c in checks), [c.first_failure for c in checks if not c.passed]

    rng = np.random.default_rng(5)
    worst = 0.0
    for _ in range(12):
        case = random_attention_case(rng, max_context=900, max_seqs=6)
        rng.integers(6)  # the launch shape compare_attention_with_reference draws next: the same cases as it sees
        want = dense_attention_reference(case.q, case.k, case.v, case.context_lens, case.scale)
        assert want.dtype == np.float64
        q32, k32, v32 = case.q, case.k.astype(np.float32), case.v.astype(np.float32)
        group = q32.shape[1] // k32.shape[2]
        for s, n in enumerate(case.context_lens):  # the float32 twin this module used to have
            ks, vs = np.repeat(k32[s, :n], group, axis=1), np.repeat(v32[s, :n], group, axis=1)
            scores = np.einsum("hd,nhd->hn", q32[s], ks) * np.float32(case.scale)
            p = np.exp(scores - scores.max(axis=-1, keepdims=True))
            got = np.einsum("hn,nhd->hd", p / p.sum(axis=-1, keepdims=True), vs)
            worst = max(worst, relative_error(got[None], want[s][None]))
    assert worst > ATTENTION_TOLERANCE


def test_a_block_over_1024_threads_is_refused_before_launch(kernels):
    """A GPU refuses a launch of more than 1024 threads per block; the emulation would run it, so the wrapper, which
    both share, refuses it first."""
    buf = np.zeros(4096, dtype=np.uint8)
    with pytest.raises(ValueError, match="at most 1024 threads"):
        kernels.fill(buf, 0, 4096, 0x01020304, block=1025)
    kernels.fill(buf, 0, 4096, 0x01020304, block=1024)
    assert (buf.view(np.uint32) == 0x01020304).all()
    with pytest.raises(ValueError, match="at most 1024 threads"):
        EmulatedKernels(kernels.lib, block=2048)
