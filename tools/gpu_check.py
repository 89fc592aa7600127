"""minialloc's GPU check: one run on a GPU machine, one table. Run it as tools/gpu_check.sh [--dry-run].

What it checks, each as a row of the table:
1. each CUDA kernel against its NumPy twin, on poisoned random inputs: on the CPU through the emulation
   header (always), and on the GPU through CuPy;
2. the canonical scenario ("5 GB free, can't allocate 2 GB" on an 8 GiB card): minialloc's prediction on
   SimulatedGPU, then real PyTorch in fresh processes with torch.cuda.set_per_process_memory_fraction making an
   8 GiB card: natively it must raise torch.OutOfMemoryError, with reserved and allocated bytes equal to
   minialloc's after every event; with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True it must fit;
3. minialloc itself on the real GPU (CudaGPU): the scenario with cudaMalloc and with real cuMemMap, and
   randomized traces with check_invariants after every step and every block filled with its own pattern and
   verified before it is freed (a block handed out twice shows as a corrupted pattern);
4. the cost of one malloc or free: minialloc (simulated and real), PyTorch's allocator, CuPy's pool;
5. paged attention (minialloc.kernels, paged_attention.cu): against its float64 twin and dense attention, on the
   CPU through the emulation (always) and on the GPU (max relative error < 1e-5); its achieved bandwidth as a
   share of the card's measured device-to-device copy bandwidth (target >= 60%); and its time against the same
   kernel over contiguous K/V (dense_attention), the cost of reading through block tables (the paper measured
   20-26% for vLLM's kernel; the row passes below 20%).

--dry-run does every CPU-side part (emulated kernels, the prediction, minialloc's own cost) and marks the GPU rows
"skipped". The exit status is 1 when any row FAILs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # gpu_check.sh sets PYTHONPATH; this keeps `python3 tools/gpu_check.py` working
    sys.path.insert(0, str(ROOT))

from minialloc import CachingAllocator, OutOfMemoryError, SimulatedGPU, format_size, workloads  # noqa: E402
from minialloc.sizes import GiB, MiB  # noqa: E402
from minialloc.workloads import Event as Op  # noqa: E402  (one trace event: op, name, size, stream, label)

BUDGET = 8 * GiB  # the card the scenario is about
CHILD_TIMEOUT_S = 240


class Row(NamedTuple):
    check: str
    result: str  # PASS, FAIL, info, or "skipped: <why>"
    detail: str


def canonical_scenario() -> tuple[str, list[Op], int]:
    """(where it came from, events, capacity): the course's "5 GB free, can't allocate 2 GB" trace."""
    return "minialloc.workloads.canonical_scenario()", workloads.canonical_scenario(), workloads.CANONICAL_CAPACITY


def random_trace(n: int, seed: int, max_size: int = 16 * MiB, max_live: int = 256) -> list[Op]:
    """Allocations of log-uniform sizes (512 B to max_size) and frees of random live blocks."""
    rng = random.Random(seed)
    ops: list[Op] = []
    live: list[str] = []
    for i in range(n):
        if live and (len(live) >= max_live or rng.random() < 0.45):
            ops.append(Op("free", live.pop(rng.randrange(len(live)))))
        else:
            size = int(math.exp(rng.uniform(math.log(512), math.log(max_size))))
            ops.append(Op("alloc", f"r{i}", size))
            live.append(f"r{i}")
    return ops + [Op("free", name) for name in live]


# -- replaying a trace -----------------------------------------------------------------------------------------------
class Replay(NamedTuple):
    samples: list[tuple[int, int]]  # (allocated, reserved) after every event
    first_oom: int | None
    message: str


def replay(ops: Sequence[Op], malloc: Callable[[Op], Any], free: Callable[[Any], None],
           empty_cache: Callable[[], None], stats: Callable[[], tuple[int, int]], oom: type[BaseException],
           after: Callable[[], None] = lambda: None) -> Replay:
    """Run ops; an allocation that fails with `oom` is skipped (and its free too), the run goes on."""
    live: dict[str, Any] = {}
    samples: list[tuple[int, int]] = []
    first_oom: int | None = None
    message = ""
    for i, ev in enumerate(ops):
        if ev.op == "alloc":
            try:
                live[ev.name] = malloc(ev)
            except oom as e:
                if first_oom is None:
                    first_oom, message = i, str(e).splitlines()[0]
        elif ev.op == "free":
            if ev.name in live:
                free(live.pop(ev.name))
        elif ev.op == "empty_cache":
            empty_cache()
        samples.append(stats())
        after()
    for handle in live.values():
        free(handle)
    return Replay(samples, first_oom, message)


def replay_minialloc(ops: Sequence[Op], alloc: CachingAllocator, on_alloc=None, on_free=None,
                     check: bool = False) -> Replay:
    """Replay on a minialloc allocator; on_alloc(ptr, op) / on_free(ptr, op) touch the memory when given."""
    sizes: dict[int, Op] = {}

    def malloc(ev: Op) -> int:
        ptr = alloc.malloc(ev.size, ev.stream)
        sizes[ptr] = ev
        if on_alloc is not None:
            on_alloc(ptr, ev)
        return ptr

    def free(ptr: int) -> None:
        if on_free is not None:
            on_free(ptr, sizes[ptr])
        alloc.free(ptr)

    return replay(ops, malloc, free, alloc.empty_cache, lambda: (alloc.memory_allocated(), alloc.memory_reserved()),
                  OutOfMemoryError, alloc.check_invariants if check else lambda: None)


def predict(ops: Sequence[Op], capacity: int, config: str, fraction: float | None = None) -> Replay:
    """minialloc's prediction on a simulated GPU (optionally capped by a memory fraction, as PyTorch is)."""
    alloc = CachingAllocator(SimulatedGPU(capacity), config)
    alloc.record_memory_history(enabled=False)
    if fraction is not None:
        alloc.set_per_process_memory_fraction(fraction)
    return replay_minialloc(ops, alloc)


def first_difference(a: Replay, b: Replay, names: tuple[str, str]) -> str | None:
    """None when two replays agree at every event, else where they first part."""
    if a.first_oom != b.first_oom:
        return f"first OOM at event {a.first_oom} ({names[0]}) vs {b.first_oom} ({names[1]})"
    for i, (x, y) in enumerate(zip(a.samples, b.samples, strict=True)):
        if x != y:
            return (f"event {i}: {names[0]} allocated/reserved {format_size(x[0])}/{format_size(x[1])}, "
                    f"{names[1]} {format_size(y[0])}/{format_size(y[1])}")
    return None


def time_per_op(ops: Sequence[Op], malloc: Callable[[int], Any], free: Callable[[Any], None]) -> float:
    """Microseconds per malloc or free over the second of two passes (the first fills the cache)."""
    elapsed = 0.0
    for _ in range(2):
        live: dict[str, Any] = {}
        start = time.perf_counter()
        for ev in ops:
            if ev.op == "alloc":
                live[ev.name] = malloc(ev.size)
            else:
                free(live.pop(ev.name))
        elapsed = time.perf_counter() - start
    return elapsed / len(ops) * 1e6


# -- the rows --------------------------------------------------------------------------------------------------------
def _kernel_label(name: str) -> str:
    return "move (block_copy launches in plan order)" if name == "move" else f"kernel {name}"


def kernel_rows_cpu() -> list[Row]:
    from minialloc.kernels.check import compare_with_reference
    from minialloc.kernels.emulation import EmulatedKernels, EmulationUnavailable

    orders = (0, 1, 20240607)  # in order, reversed, shuffled
    try:
        runs = [compare_with_reference(EmulatedKernels.build(order=o), seed=i) for i, o in enumerate(orders)]
    except EmulationUnavailable as e:
        return [Row("kernels: CPU emulation vs NumPy", f"skipped: {e}", "")]
    rows = []
    for checks in zip(*runs, strict=True):
        err = max(c.max_abs_error for c in checks)
        failure = next((c.first_failure for c in checks if c.first_failure), "")
        rows.append(Row(f"{_kernel_label(checks[0].kernel)}: CPU emulation vs NumPy", "PASS" if err == 0 else "FAIL",
                        f"{sum(c.cases for c in checks)} cases, 3 thread orders, poisoned outputs, "
                        f"max abs err {err}" + (f"; first: {failure}" if failure else "")))
    return rows


def kernel_rows_gpu() -> list[Row]:
    import cupy
    import numpy as np

    from minialloc.kernels.check import compare_with_reference
    from minialloc.kernels.gpu import CupyKernels

    kernels = CupyKernels()
    rows = []
    for c in compare_with_reference(kernels, seed=7, rounds=32, max_size=4 * MiB):
        rows.append(Row(f"{_kernel_label(c.kernel)}: GPU vs NumPy", "PASS" if c.max_abs_error == 0 else "FAIL",
                        f"{c.cases} cases up to 4 MiB, poisoned outputs, max abs err {c.max_abs_error}"
                        + (f"; first: {c.first_failure}" if c.first_failure else "")))
    # one big range with the default launch shape (grid capped, so each thread strides 1000+ times)
    n = 256 * MiB + 3
    buf = cupy.zeros(n, cupy.uint8)
    kernels.fill(buf, 0, n, 0xDBDBDBDB)
    buf[n - 2] = 0
    found = kernels.guard_check(buf, 0, n, 0xDBDBDBDB)
    ok = found == n - 2 and int(cupy.count_nonzero(buf != np.uint8(0xDB))) == 1
    rows.append(Row("kernels fill + guard_check on 256 MiB + 3 B", "PASS" if ok else "FAIL",
                    f"guard_check found offset {found}, planted at {n - 2}"))
    return rows


# -- paged attention -------------------------------------------------------------------------------------------------
BANDWIDTH_TARGET = 0.60  # the issue: paged attention moves data at >= 60% of a device-to-device copy's rate
OVERHEAD_TARGET = 0.20  # below the paper's 20-26% for vLLM's paged kernel against a contiguous one


def attention_rows_cpu() -> list[Row]:
    from minialloc.kernels.check import ATTENTION_TOLERANCE, compare_attention_with_reference
    from minialloc.kernels.emulation import EmulatedKernels, EmulationUnavailable

    orders = (0, 1, 20240607)
    try:
        runs = [compare_attention_with_reference(EmulatedKernels.build(order=o), seed=50 + i, rounds=8)
                for i, o in enumerate(orders)]
    except EmulationUnavailable as e:
        return [Row("kernel paged_attention: CPU emulation vs NumPy", f"skipped: {e}", "")]
    labels = {"paged_attention": "kernel paged_attention: CPU emulation vs NumPy",
              "paged_attention vs dense attention": "paged_attention vs dense attention: CPU emulation",
              "dense_attention": "kernel dense_attention: CPU emulation vs NumPy"}
    rows = []
    for checks in zip(*runs, strict=True):
        err = max(c.max_rel_error for c in checks)
        failure = next((c.first_failure for c in checks if c.first_failure), "")
        rows.append(Row(labels[checks[0].kernel], "PASS" if all(c.passed for c in checks) else "FAIL",
                        f"{sum(c.cases for c in checks)} random cases (GQA, odd lengths, scattered tables), 3 thread "
                        f"orders, NaN-poisoned outputs, max rel err {err:.2g} (< {ATTENTION_TOLERANCE:g})"
                        + (f"; first: {failure}" if failure else "")))
    return rows


class AttentionBench(NamedTuple):
    num_seqs: int
    num_heads: int
    head_dim: int
    block_size: int
    lens: tuple[int, int]  # shortest and longest context
    kv_bytes: int  # bytes the paged kernel must move: K and V of every context, q, out, tables
    paged_s: float
    dense_s: float
    copy_bytes_per_s: float  # read + written per second by a device-to-device copy
    agreement: float  # relative error between the paged and the dense kernel's outputs

    @property
    def bandwidth(self) -> float:
        return self.kv_bytes / self.paged_s

    @property
    def share(self) -> float:
        return self.bandwidth / self.copy_bytes_per_s

    @property
    def overhead(self) -> float:
        return self.paged_s / self.dense_s - 1


def _normal(xp: Any, seed: int, shape: tuple[int, ...]) -> Any:
    import numpy as np

    if xp is np:
        return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    return xp.random.RandomState(seed).standard_normal(shape, dtype=xp.float32)


def attention_workload(xp: Any, num_seqs: int, num_heads: int, head_dim: int, block_size: int,
                       len_range: tuple[int, int], seed: int = 0) -> dict[str, Any]:
    """Decode batch for the benchmark: context lengths uniform in len_range, every sequence's blocks scattered
    over the cache (a random permutation, as after a while of serving), and the same K and V gathered into
    contiguous [num_seqs, max_len, heads, head_dim] arrays for the dense kernel. Multi-head (kv heads = heads),
    so every byte of K and V is read exactly once."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lens = rng.integers(len_range[0], len_range[1] + 1, num_seqs)
    nblocks = -(-lens // block_size)
    order = rng.permutation(int(nblocks.sum()))
    tables = np.zeros((num_seqs, int(nblocks.max())), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(nblocks)])
    for s in range(num_seqs):
        tables[s, : nblocks[s]] = order[starts[s] : starts[s + 1]]
    kv = _normal(xp, seed, (int(nblocks.sum()), 2, block_size, num_heads, head_dim))
    q = _normal(xp, seed + 1, (num_seqs, num_heads, head_dim))
    pos = np.arange(int(lens.max()))
    blocks = np.take_along_axis(tables, np.minimum(pos // block_size, nblocks[:, None] - 1), axis=1)
    offsets = np.broadcast_to(pos % block_size, blocks.shape)
    where = (xp.asarray(blocks), xp.asarray(np.ascontiguousarray(offsets)))
    k, v = kv[:, 0][where], kv[:, 1][where]  # position p of sequence s: its slot through the table
    kv_bytes = 4 * (2 * int(lens.sum()) * num_heads * head_dim + 2 * q.size + tables.size + num_seqs)
    return {"q": q, "kv": kv, "tables": tables, "lens": lens, "k": k, "v": v, "kv_bytes": kv_bytes}


def attention_benchmark(kernels: Any, seconds: Callable[[Callable[[], Any]], float],
                        device_copy: Callable[[Any, Any], Any], num_seqs: int = 256, num_heads: int = 32,
                        head_dim: int = 128, block_size: int = 16, len_range: tuple[int, int] = (256, 2048),
                        copy_bytes: int = 1 << 30) -> AttentionBench:
    """Time paged_attention, dense_attention (the same kernel over contiguous K/V) and a device-to-device copy
    of copy_bytes; `seconds(fn)` times one call of fn, `device_copy(dst, src)` copies a whole buffer."""
    from minialloc.kernels.reference import relative_error

    w = attention_workload(kernels.xp, num_seqs, num_heads, head_dim, block_size, len_range)
    scale = head_dim**-0.5
    paged = kernels.prepare_paged_attention(w["q"], w["kv"], w["tables"], w["lens"], scale)
    dense = kernels.prepare_dense_attention(w["q"], w["k"], w["v"], w["lens"], scale)
    paged_s, dense_s = seconds(paged), seconds(dense)
    agreement = relative_error(kernels.to_host(paged()), kernels.to_host(dense()))
    src = kernels.xp.ones(copy_bytes, dtype=kernels.xp.uint8)
    dst = kernels.xp.empty_like(src)
    copy_s = seconds(lambda: device_copy(dst, src))
    return AttentionBench(num_seqs, num_heads, head_dim, block_size, (int(w["lens"].min()), int(w["lens"].max())),
                          w["kv_bytes"], paged_s, dense_s, 2 * copy_bytes / copy_s, agreement)


def attention_bench_rows(bench: AttentionBench) -> list[Row]:
    from minialloc.kernels.check import ATTENTION_TOLERANCE

    gb = 1e9
    shape = (f"{bench.num_seqs} seqs, contexts {bench.lens[0]}-{bench.lens[1]}, {bench.num_heads} heads x "
             f"{bench.head_dim}, blocks of {bench.block_size}, float32")
    agree = bench.agreement < ATTENTION_TOLERANCE
    return [
        Row("paged_attention bandwidth vs device-to-device copy",
            "PASS" if bench.share >= BANDWIDTH_TARGET else "FAIL",
            f"{bench.bandwidth / gb:.0f} GB/s = {bench.share:.0%} of a cudaMemcpy D2D's "
            f"{bench.copy_bytes_per_s / gb:.0f} GB/s (target >= {BANDWIDTH_TARGET:.0%}); "
            f"{format_size(bench.kv_bytes)} in {bench.paged_s * 1e3:.2f} ms; {shape}"),
        Row("paged_attention time vs dense attention",
            "PASS" if bench.overhead < OVERHEAD_TARGET and agree else "FAIL",
            f"paged {bench.paged_s * 1e3:.3f} ms, dense (same kernel, contiguous K/V) {bench.dense_s * 1e3:.3f} ms: "
            f"ratio {bench.paged_s / bench.dense_s:.3f}, overhead {bench.overhead:+.1%} (paper: +20-26%; pass below "
            f"+{OVERHEAD_TARGET:.0%}); outputs agree to rel err {bench.agreement:.2g}"),
    ]


def attention_rows_gpu() -> list[Row]:
    import cupy

    from minialloc.kernels.check import compare_attention_with_reference
    from minialloc.kernels.gpu import CupyKernels

    kernels = CupyKernels()
    checks = compare_attention_with_reference(kernels, seed=9, rounds=16, max_context=1500, max_seqs=6)
    failure = next((c.first_failure for c in checks if c.first_failure), "")
    rows = [Row("paged_attention: GPU vs NumPy and dense attention", "PASS" if all(c.passed for c in checks)
                else "FAIL", "; ".join(f"{c.kernel} max rel err {c.max_rel_error:.2g}" for c in checks)
                + f" ({checks[0].cases} cases, contexts up to 1500)" + (f"; first: {failure}" if failure else ""))]

    def seconds(fn: Callable[[], Any]) -> float:
        """Best of 3 runs of 10 back-to-back calls, timed with events on the current stream."""
        fn()  # compiles the module on first use
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        best = math.inf
        for _ in range(3):
            start.record()
            for _ in range(10):
                fn()
            end.record()
            end.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(start, end) / 1e3 / 10)
        return best

    def device_copy(dst: Any, src: Any) -> None:
        dst.data.copy_from_device_async(src.data, src.nbytes)  # cudaMemcpyAsync device to device

    free, _ = cupy.cuda.runtime.memGetInfo()
    per_seq = (1152 + 2048) * 32 * 128 * 4 * 2  # paged (mean context) + dense (max_len) K and V
    num_seqs = max(8, min(256, int(0.5 * (free - (2 << 30)) / per_seq)))
    bench = attention_benchmark(kernels, seconds, device_copy, num_seqs=num_seqs,
                                copy_bytes=min(1 << 30, free // 8))
    cupy.get_default_memory_pool().free_all_blocks()
    return rows + attention_bench_rows(bench)


def prediction_rows(source: str, ops: list[Op], capacity: int) -> list[Row]:
    native = predict(ops, capacity, "")
    expandable = predict(ops, capacity, "expandable_segments:True")
    ok = native.first_oom is not None and expandable.first_oom is None
    detail = "native fits: the scenario does not fail"
    if native.first_oom is not None:
        ev = ops[native.first_oom]
        allocated, reserved = native.samples[native.first_oom]
        detail = (f"native: OOM at event {native.first_oom}/{len(ops)} asking {format_size(ev.size)} with "
                  f"{format_size(reserved - allocated)} reserved but free; expandable_segments: "
                  + ("fits" if expandable.first_oom is None else f"OOM at event {expandable.first_oom}"))
    return [Row(f"scenario on SimulatedGPU {format_size(capacity)}", "PASS" if ok else "FAIL",
                f"{source}, {len(ops)} events; {detail}")]


def torch_child(mode: str, budget: int) -> None:
    """Run in a fresh process: the scenario under PyTorch with an 8 GiB fraction, then (native) the cost trace."""
    import torch

    ops = [Op(*e) for e in json.loads(sys.stdin.read())]
    total = torch.cuda.mem_get_info()[1]
    fraction = budget / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    result = replay(
        ops,
        lambda ev: torch.empty(ev.size, dtype=torch.uint8, device="cuda"),
        lambda tensor: None,  # the tensor dies when replay drops it from its table
        torch.cuda.empty_cache,
        lambda: (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()),
        torch.OutOfMemoryError,
    )
    out: dict[str, Any] = {"total": total, "fraction": fraction, "samples": result.samples,
                           "first_oom": result.first_oom, "message": result.message}
    if mode == "native":
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0)
        out["us_per_op"] = time_per_op(random_trace(20000, seed=3), torch.cuda.caching_allocator_alloc,
                                       torch.cuda.caching_allocator_delete)
    print(json.dumps(out))


def run_torch(mode: str, ops: list[Op]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    proc = subprocess.run([sys.executable, __file__, "--torch-child", mode], input=json.dumps(ops), env=env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"torch child ({mode}) exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["replay"] = Replay([tuple(s) for s in out["samples"]], out["first_oom"], out["message"])
    return out


def torch_rows(ops: list[Op], budget: int) -> tuple[list[Row], float | None]:
    rows = []
    native = run_torch("native", ops)
    expandable = run_torch("expandable", ops)
    total, fraction = native["total"], native["fraction"]
    card = f"{format_size(budget)} of {format_size(total)} by memory fraction {fraction:.4f}"
    t = native["replay"]
    rows.append(Row(f"PyTorch native, {card}", "PASS" if t.first_oom is not None else "FAIL",
                    f"torch.OutOfMemoryError at event {t.first_oom}: {t.message[:90]}" if t.first_oom is not None
                    else "no OutOfMemoryError: the trace fit"))
    for mode, run in (("native", native), ("expandable", expandable)):
        config = "expandable_segments:True" if mode == "expandable" else ""
        diff = first_difference(predict(ops, total, config, fraction), run["replay"], ("minialloc", "torch"))
        rows.append(Row(f"minialloc prediction = PyTorch {mode}, every event", "PASS" if diff is None else "FAIL",
                        diff or f"reserved and allocated equal after all {len(ops)} events"))
    e = expandable["replay"]
    rows.append(Row("PyTorch expandable_segments:True (fresh process)", "PASS" if e.first_oom is None else "FAIL",
                    "fits" if e.first_oom is None else f"OOM at event {e.first_oom}: {e.message[:90]}"))
    return rows, native.get("us_per_op")


class PatternChecker:
    """Fill each block with its own pattern when it is handed out; check the pattern is intact when it is freed.
    Two live blocks sharing a byte, or a block handed out twice, show as a corrupted pattern."""

    def __init__(self, gpu: Any) -> None:
        from minialloc.cupy_allocator import as_cupy_array

        self.gpu, self.view = gpu, as_cupy_array
        self.patterns: dict[int, int] = {}
        self.corrupted: list[str] = []

    def on_alloc(self, ptr: int, ev: Op) -> None:
        self.patterns[ptr] = zlib.crc32(ev.name.encode()) | 1  # never 0, the pattern of fresh memory
        self.gpu.kernels(ev.stream).fill(self.view(ptr, ev.size, self.gpu.index), 0, ev.size, self.patterns[ptr])

    def on_free(self, ptr: int, ev: Op) -> None:
        bad = self.gpu.kernels(ev.stream).guard_check(self.view(ptr, ev.size, self.gpu.index), 0, ev.size,
                                                      self.patterns.pop(ptr))
        if bad >= 0:
            self.corrupted.append(f"{ev.name} corrupted at offset {bad}")


def cudagpu_row(config: str, name: str, trace: list[Op], budget: int, want_oom: bool | None) -> Row:
    """Replay on CudaGPU(limit=budget), invariants after every event; when want_oom is given, the run must also
    equal the SimulatedGPU prediction event by event and fail (or fit) as the scenario says."""
    from minialloc.cuda_device import CudaGPU

    gpu = CudaGPU(limit=budget)
    alloc = CachingAllocator(gpu, config)
    checker = PatternChecker(gpu)
    result = replay_minialloc(trace, alloc, checker.on_alloc, checker.on_free, check=True)
    problems = checker.corrupted[:3]
    if want_oom is not None:
        diff = first_difference(result, predict(trace, budget, config), ("CudaGPU", "SimulatedGPU"))
        if diff:
            problems.append(diff)
        if (result.first_oom is not None) != want_oom:
            problems.append(f"first OOM at event {result.first_oom}, expected {'one' if want_oom else 'none'}")
    alloc.empty_cache()
    if alloc.memory_reserved() or gpu.used_bytes or gpu.mapped_pages:
        problems.append(f"after empty_cache: reserved {alloc.memory_reserved()}, device holds {gpu.used_bytes}, "
                        f"{gpu.mapped_pages} pages mapped")
    how = "cuMemMap, expandable" if config else "cudaMalloc"
    detail = f"{len(trace)} events, invariants after each, block patterns intact, all memory returned"
    if want_oom is None:
        detail += f", {alloc.memory_stats()['num_ooms']} OOMs on the way"
    else:
        detail += "; equal to SimulatedGPU at every event"
    return Row(f"minialloc on CudaGPU ({how}): {name}", "FAIL" if problems else "PASS",
               "; ".join(problems) or detail)


def cudagpu_rows(ops: list[Op], budget: int) -> list[Row]:
    trace = random_trace(3000, seed=11, max_size=256 * MiB, max_live=64)
    rows = []
    for config in ("", "expandable_segments:True"):
        rows.append(cudagpu_row(config, "scenario", ops, budget, want_oom=not config))
        rows.append(cudagpu_row(config, "random trace", trace, budget, want_oom=None))
    return rows


def cost_rows(gpu_ok: bool, torch_us: float | None) -> list[Row]:
    ops = random_trace(20000, seed=3)
    alloc = CachingAllocator(SimulatedGPU("80GiB"))
    alloc.record_memory_history(enabled=False)
    rows = [Row("cost: minialloc on SimulatedGPU", "info",
                f"{time_per_op(ops, alloc.malloc, alloc.free):.2f} us per malloc or free ({len(ops)} ops, warm)")]
    if not gpu_ok:
        return rows
    import cupy

    from minialloc.cuda_device import CudaGPU

    alloc = CachingAllocator(CudaGPU())
    alloc.record_memory_history(enabled=False)
    rows.append(Row("cost: minialloc on CudaGPU", "info",
                    f"{time_per_op(ops, alloc.malloc, alloc.free):.2f} us per malloc or free"))
    alloc.empty_cache()
    if torch_us is not None:
        rows.append(Row("cost: PyTorch caching allocator", "info", f"{torch_us:.2f} us per malloc or free"))
    pool = cupy.cuda.MemoryPool()
    rows.append(Row("cost: CuPy MemoryPool", "info",
                    f"{time_per_op(ops, pool.malloc, lambda mp: None):.2f} us per malloc or free"))
    pool.free_all_blocks()
    return rows


def print_table(rows: list[Row]) -> None:
    w1 = max(len(r.check) for r in rows)
    w2 = max(len(r.result) for r in rows)
    rule = "-" * (w1 + w2 + 60)
    print(rule)
    print(f"{'check':<{w1}}  {'result':<{w2}}  detail")
    print(rule)
    for r in rows:
        print(f"{r.check:<{w1}}  {r.result:<{w2}}  {r.detail}")
    print(rule)


def debug_and_compaction_rows(make_device: Callable[[], Any] | None = None, where: str = "CudaGPU") -> list[Row]:
    """debug_guards and defragment(): a one-byte overflow is reported at free with the right address and offset,
    fresh memory is zeroed and freed memory poisoned by the fill kernel; buffers' bytes survive compaction
    (block_copy launches, move_plan for overlapping moves), and a request that failed before fits after."""
    import numpy as np

    from minialloc.debug import GUARD_BYTES, GuardViolation, device_data

    if make_device is None:
        from minialloc.cuda_device import CudaGPU

        def make_device():
            return CudaGPU(limit=256 * MiB)

    rows = []
    gpu = make_device()
    a = CachingAllocator(gpu, "debug_guards:True")
    data = device_data(gpu)
    p = a.malloc(1000)
    fresh = data.read(p, 1000 + GUARD_BYTES)
    problems = [] if not fresh[:1000].any() and (fresh[1000:] == 0xFD).all() else ["new block not zeroed+guarded"]
    data.write(p + 1000, np.zeros(1, np.uint8))  # one byte past the end
    try:
        a.free(p)
        problems.append("no GuardViolation")
    except GuardViolation as e:
        if (e.ptr, e.requested_size, e.offset) != (p, 1000, 1000):
            problems.append(f"reported {e.ptr:#x}+{e.offset}, expected {p:#x}+1000")
    if not (data.read(p, 1024) == 0xDB).all():
        problems.append("freed block not poisoned")
    a.check_invariants()
    a.empty_cache()  # the next check fills the card's limit
    rows.append(Row(f"debug_guards on {where}: one byte past the end", "FAIL" if problems else "PASS",
                    "; ".join(problems) or "reported at free with address and offset; zeroed, guarded, poisoned"))

    a = CachingAllocator(gpu, "")
    bufs = []
    try:
        while True:
            bufs.append(a.buffer(4 * MiB))
    except OutOfMemoryError:
        pass
    rng = np.random.default_rng(0)
    for b in bufs:
        b.write(rng.integers(0, 256, b.nbytes, dtype=np.uint8))
    live = [b for i, b in enumerate(bufs) if i % 5 in (1, 3)]
    for i, b in enumerate(bufs):
        if i % 5 not in (1, 3):
            b.free()
    contents = [b.read() for b in live]
    problems = []
    try:
        a.free(a.malloc(8 * MiB))
        problems.append("8 MiB fit before defragment()")
    except OutOfMemoryError:
        pass
    t0 = time.perf_counter()
    report = a.defragment()
    ms = (time.perf_counter() - t0) * 1e3
    if sum((b.read() != c).any() for b, c in zip(live, contents, strict=True)):
        problems.append("buffer bytes changed by the moves")
    a.check_invariants()
    try:
        a.free(a.malloc(8 * MiB))
    except OutOfMemoryError:
        problems.append("8 MiB still does not fit after defragment()")
    for b in live:
        b.free()
    a.empty_cache()
    rows.append(Row(f"defragment() on {where}: fragmented 256 MiB", "FAIL" if problems else "PASS",
                    "; ".join(problems) or f"{report.blocks_moved} blocks ({format_size(report.bytes_moved)}) moved "
                    f"in {ms:.1f} ms, bytes intact; largest free {format_size(report.largest_free_before)} -> "
                    f"{format_size(report.largest_free_after)}; 8 MiB fits after, not before"))
    return rows


def guarded(rows: list[Row], name: str, fn: Callable[[], list[Row]]) -> None:
    """Run one section; an exception becomes a FAIL row instead of ending the check."""
    try:
        rows.extend(fn())
    except Exception as e:  # every failure must reach the table, not end the run
        rows.append(Row(name, "FAIL", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU-side parts only; GPU rows are skipped")
    parser.add_argument("--torch-child", choices=("native", "expandable"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_child:
        torch_child(args.torch_child, BUDGET)
        return 0

    from minialloc.cuda_device import cuda_unavailable_reason

    start = time.perf_counter()
    reason = cuda_unavailable_reason()
    gpu_ok = reason is None and not args.dry_run
    skip = "skipped: no GPU" if reason is not None else "skipped: dry run"
    source, ops, capacity = canonical_scenario()
    rows: list[Row] = []
    guarded(rows, "kernels: CPU emulation", kernel_rows_cpu)
    guarded(rows, "kernel paged_attention: CPU emulation vs NumPy", attention_rows_cpu)
    guarded(rows, "scenario prediction", lambda: prediction_rows(source, ops, capacity))
    guarded(rows, "debug guards + compaction on the simulator",
            lambda: debug_and_compaction_rows(lambda: SimulatedGPU(256 * MiB, store_data=True), "SimulatedGPU"))
    torch_us = None
    if gpu_ok:
        guarded(rows, "kernels on the GPU", kernel_rows_gpu)
        guarded(rows, "debug guards + compaction on CudaGPU", debug_and_compaction_rows)
        guarded(rows, "paged_attention on the GPU", attention_rows_gpu)

        def torch_section() -> list[Row]:
            nonlocal torch_us
            torch_rows_, torch_us = torch_rows(ops, capacity)
            return torch_rows_

        guarded(rows, "PyTorch", torch_section)
        guarded(rows, "minialloc on CudaGPU", lambda: cudagpu_rows(ops, capacity))
    else:
        for i, name in enumerate(("kernels: GPU vs NumPy", "paged_attention: GPU vs NumPy and dense attention",
                     "paged_attention bandwidth vs device-to-device copy", "paged_attention time vs dense attention",
                     "PyTorch native vs minialloc prediction",
                     "PyTorch expandable_segments:True", "minialloc on CudaGPU (cudaMalloc and cuMemMap)",
                     "debug_guards and defragment() on CudaGPU",
                     "cost: PyTorch allocator, CuPy pool, minialloc on CudaGPU")):
            rows.append(Row(name, skip, (reason or "") if i == 0 else ""))
    guarded(rows, "cost", lambda: cost_rows(gpu_ok, torch_us))
    print_table(rows)
    failed = sum(r.result == "FAIL" for r in rows)
    print(f"{len(rows)} rows, {failed} failed, {time.perf_counter() - start:.1f} s")
    if not gpu_ok and not args.dry_run:
        print(f"no GPU here ({reason}): the GPU rows did not run; use --dry-run for the CPU-side parts")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
