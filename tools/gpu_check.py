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

It runs with whatever Python it is given (PYTHON=python3 tools/gpu_check.sh on a GPU machine that already has
torch, CuPy, numpy and sortedcontainers). It first prints the versions it found (Python, numpy, torch and its CUDA,
CuPy, the CUDA runtime, NVRTC, cuRAND). What is missing is one line, never a traceback: without numpy or
sortedcontainers (minialloc's own needs) it stops there with exit status 2; without torch or CuPy, or with CuPy
unable to load NVRTC, the rows that need them say so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
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

MINIALLOC_NEEDS = ("numpy", "sortedcontainers")  # what `import minialloc` needs; everything else is per row


def missing_modules(names: Sequence[str]) -> list[str]:
    """The modules among `names` that fail to import here (an import, not a path search: a broken install counts)."""
    missing = []
    for name in names:
        try:
            __import__(name)
        except Exception:  # ImportError, or a package whose own imports fail: unusable either way
            missing.append(name)
    return missing


if __name__ == "__main__" and (_missing := missing_modules(MINIALLOC_NEEDS)):
    print(f"gpu_check: {sys.executable} lacks {', '.join(_missing)}, which minialloc needs: "
          f"pip install {' '.join(_missing)} (or run `make gpu-check`, which builds a virtual environment)")
    sys.exit(2)

from minialloc import CachingAllocator, OutOfMemoryError, SimulatedGPU, format_size, workloads  # noqa: E402
from minialloc.crosscheck import (  # noqa: E402
    SampledRun,
    first_difference,
    predict,
    random_ops,
    run_on_allocator,
    run_sampled,
)
from minialloc.device import DeviceError  # noqa: E402
from minialloc.kernels.bench import AttentionBench, attention_benchmark  # noqa: E402
from minialloc.sizes import GiB, MiB  # noqa: E402
from minialloc.timing import time_per_op  # noqa: E402
from minialloc.workloads import MemoryOp  # noqa: E402

MIRRORED_TORCH = "2.13"  # the PyTorch release whose allocator minialloc follows
BUDGET = 8 * GiB  # the card the scenario is about
CHILD_TIMEOUT_S = 120  # per PyTorch child: two of them, so the whole check stays under 5 minutes


class Row(NamedTuple):
    check: str
    result: str  # PASS, FAIL, info, or "skipped: <why>"
    detail: str


def canonical_scenario() -> tuple[str, list[MemoryOp], int]:
    """(where it came from, events, capacity): the course's "5 GB free, can't allocate 2 GB" trace."""
    return "minialloc.workloads.canonical_scenario()", workloads.canonical_scenario(), workloads.CANONICAL_CAPACITY


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


def prediction_rows(source: str, ops: list[MemoryOp], capacity: int) -> list[Row]:
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

    ops = [MemoryOp(*e) for e in json.loads(sys.stdin.read())]
    total = torch.cuda.mem_get_info()[1]
    fraction = budget / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    result = run_sampled(
        ops,
        lambda ev: torch.empty(ev.size, dtype=torch.uint8, device="cuda"),
        lambda tensor: None,  # the tensor dies when run_sampled drops it from its table
        torch.cuda.empty_cache,
        lambda: (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()),
        torch.OutOfMemoryError,
    )
    out: dict[str, Any] = {"torch": f"{torch.__version__} (CUDA {torch.version.cuda})",
                           "total": total, "fraction": fraction, "samples": result.samples,
                           "first_oom": result.first_oom, "message": result.message}
    if mode == "native":
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0)
        out["us_per_op"] = time_per_op(random_ops(20000, seed=3), torch.cuda.caching_allocator_alloc,
                                       torch.cuda.caching_allocator_delete)
    print(json.dumps(out))


def run_torch(mode: str, ops: list[MemoryOp]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    proc = subprocess.run([sys.executable, __file__, "--torch-child", mode], input=json.dumps(ops), env=env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"torch child ({mode}) exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["run"] = SampledRun([tuple(s) for s in out["samples"]], out["first_oom"], out["message"])
    return out


def torch_rows(ops: list[MemoryOp], budget: int) -> tuple[list[Row], float | None]:
    rows = []
    native = run_torch("native", ops)
    expandable = run_torch("expandable", ops)
    total, fraction = native["total"], native["fraction"]
    card = f"{format_size(budget)} of {format_size(total)} by memory fraction {fraction:.4f}"
    t = native["run"]
    rows.append(Row("PyTorch version compared with", "info", torch_label(native["torch"])))
    rows.append(Row(f"PyTorch native, {card}", "PASS" if t.first_oom is not None else "FAIL",
                    f"torch.OutOfMemoryError at event {t.first_oom}: {t.message[:90]}" if t.first_oom is not None
                    else "no OutOfMemoryError: the trace fit"))
    for mode, run in (("native", native), ("expandable", expandable)):
        config = "expandable_segments:True" if mode == "expandable" else ""
        diff = first_difference(predict(ops, total, config, fraction), run["run"], ("minialloc", "torch"))
        rows.append(Row(f"minialloc prediction = PyTorch {mode}, every event", "PASS" if diff is None else "FAIL",
                        diff or f"reserved and allocated equal after all {len(ops)} events"))
    e = expandable["run"]
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

    def on_alloc(self, ptr: int, ev: MemoryOp) -> None:
        self.patterns[ptr] = zlib.crc32(ev.name.encode()) | 1  # never 0, the pattern of fresh memory
        self.gpu.kernels(ev.stream).fill(self.view(ptr, ev.size, self.gpu.index), 0, ev.size, self.patterns[ptr])

    def on_free(self, ptr: int, ev: MemoryOp) -> None:
        bad = self.gpu.kernels(ev.stream).guard_check(self.view(ptr, ev.size, self.gpu.index), 0, ev.size,
                                                      self.patterns.pop(ptr))
        if bad >= 0:
            self.corrupted.append(f"{ev.name} corrupted at offset {bad}")


def cudagpu_row(config: str, name: str, trace: list[MemoryOp], budget: int, want_oom: bool | None) -> Row:
    """Replay on CudaGPU(limit=budget), invariants after every event; when want_oom is given, the run must also
    equal the SimulatedGPU prediction event by event and fail (or fit) as the scenario says."""
    from minialloc.cuda_device import CudaGPU

    gpu = CudaGPU(limit=budget)
    alloc = CachingAllocator(gpu, config)
    checker = PatternChecker(gpu)
    result = run_on_allocator(trace, alloc, checker.on_alloc, checker.on_free, after=alloc.check_invariants)
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


def cudagpu_rows(ops: list[MemoryOp], budget: int) -> list[Row]:
    trace = random_ops(3000, seed=11, max_size=256 * MiB, max_live=64)
    rows = []
    for config in ("", "expandable_segments:True"):
        for name, events, want_oom in (("scenario", ops, not config), ("random trace", trace, None)):
            try:
                rows.append(cudagpu_row(config, name, events, budget, want_oom=want_oom))
            except Exception as e:
                if not (config and vmm_refused(e)):
                    raise
                rows.append(Row(f"minialloc on CudaGPU (cuMemMap, expandable): {name}",
                                "skipped: the platform refuses cuMemMap",
                                f"{' '.join(str(e).split())[:160]}; expandable segments cannot run here"))
    return rows


def cost_rows(gpu_ok: bool, torch_us: float | None) -> list[Row]:
    ops = random_ops(20000, seed=3)
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


def found_versions() -> dict[str, str]:
    """What this Python has, each a version or "missing: <why>" (one line each)."""
    import platform

    import numpy

    from minialloc.cuda_toolkit import cuda_libraries

    found = {"Python": f"{platform.python_version()} ({sys.executable})", "numpy": numpy.__version__}
    try:
        import torch

        cuda = torch.version.cuda
        found["torch"] = f"{torch.__version__} ({f'CUDA {cuda}' if cuda else 'a CPU build'})"
    except Exception as e:
        found["torch"] = f"missing: {' '.join(str(e).split())[:120]}"
    found.update(cuda_libraries())
    return found


def torch_on_gpu_row(versions: dict[str, str]) -> Row:
    """Does PyTorch use the GPU? A CPU build of torch on a GPU machine runs every chapter on the CPU, silently."""
    name = "PyTorch uses the GPU"
    if versions["torch"].startswith("missing"):
        return Row(name, "skipped: torch not installed", versions["torch"])
    import torch

    if torch.version.cuda is None:
        return Row(name, "FAIL", f"torch {torch.__version__} is a CPU build: install a CUDA build of PyTorch "
                   "(README: On a GPU instance)")
    if not torch.cuda.is_available():
        return Row(name, "FAIL", f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: driver too "
                   "old for this CUDA build, or CUDA_VISIBLE_DEVICES hides it")
    x = torch.ones(1 << 20, device="cuda")
    ok = float(x.sum().item()) == float(1 << 20) and torch.cuda.memory_allocated() >= x.numel() * 4
    return Row(name, "PASS" if ok else "FAIL", f"{torch.cuda.get_device_name()}: a tensor computed on it, "
               f"{format_size(torch.cuda.memory_allocated())} allocated by PyTorch's caching allocator")


def torch_label(version: str) -> str:
    """'PyTorch 2.13.0 (CUDA 12.9)', and a warning when it is not the release minialloc mirrors."""
    same = version.startswith(MIRRORED_TORCH + ".")
    return f"PyTorch {version}" + ("" if same else f", not the {MIRRORED_TORCH} minialloc mirrors: rules may differ")


def vmm_refused(e: Exception) -> bool:
    """The platform refuses the driver's virtual memory calls (some sandboxed GPU runtimes, such as gVisor, do)."""
    text = str(e)
    return isinstance(e, DeviceError) and any(
        word in text for word in ("CUDA_ERROR_NOT_SUPPORTED", "CUDA_ERROR_NOT_PERMITTED",
                                  "does not support virtual memory management"))


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
    versions = found_versions()
    print("found: " + "; ".join(f"{name} {v if not v.startswith('missing') else 'missing'}"
                                for name, v in versions.items()))
    from minialloc.cuda_toolkit import toolkit_problem

    torch_problem = versions["torch"].startswith("missing")
    for problem in (toolkit_problem(versions), "torch cannot be imported: the PyTorch rows are skipped" if
                    torch_problem else None):
        if problem:
            print(f"note: {problem}")
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
        guarded(rows, "PyTorch uses the GPU", lambda: [torch_on_gpu_row(versions)])
        guarded(rows, "kernels on the GPU", kernel_rows_gpu)
        guarded(rows, "debug guards + compaction on CudaGPU", debug_and_compaction_rows)
        guarded(rows, "paged_attention on the GPU", attention_rows_gpu)

        def torch_section() -> list[Row]:
            nonlocal torch_us
            torch_rows_, torch_us = torch_rows(ops, capacity)
            return torch_rows_

        if versions["torch"].startswith("missing"):
            rows.append(Row("PyTorch native vs minialloc prediction", "skipped: torch not installed", ""))
        else:
            guarded(rows, "PyTorch", torch_section)
        guarded(rows, "minialloc on CudaGPU", lambda: cudagpu_rows(ops, capacity))
    else:
        for i, name in enumerate(("PyTorch uses the GPU", "kernels: GPU vs NumPy",
                                  "paged_attention: GPU vs NumPy and dense attention",
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
