"""Run one workload through any allocator in lockstep with minialloc's prediction, and find where they part.

The GPU check's engine: the same list of operations (minialloc.workloads.MemoryOp) goes through PyTorch's
allocator in a child process, through minialloc on a real GPU, and through minialloc on a SimulatedGPU; after
every operation each run records (allocated, reserved). Two runs agree when those samples agree at every
operation and the first OOM is at the same one.

minialloc.replay answers another question ("would another setting have saved my run?") on a CachingAllocator
only; this module needs just malloc/free/empty_cache/stats callables, so it drives allocators that are not
minialloc's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .allocator import CachingAllocator
from .device import SimulatedGPU
from .oom import OutOfMemoryError
from .sizes import MiB, format_size
from .workloads import MemoryOp


class SampledRun(NamedTuple):
    """What a lockstep run records: (allocated, reserved) after every operation, and its first OOM."""

    samples: list[tuple[int, int]]
    first_oom: int | None
    message: str  # the first line of the first OOM's message, "" without one


def random_ops(n: int, seed: int, max_size: int = 16 * MiB, max_live: int = 256) -> list[MemoryOp]:
    """Allocations of log-uniform sizes (512 B to max_size) and frees of random live blocks; all freed at the end.

    >>> ops = random_ops(6, seed=0)
    >>> [op.op for op in ops].count("alloc") == [op.op for op in ops].count("free")
    True
    """
    rng = random.Random(seed)
    ops: list[MemoryOp] = []
    live: list[str] = []
    for i in range(n):
        if live and (len(live) >= max_live or rng.random() < 0.45):
            ops.append(MemoryOp("free", live.pop(rng.randrange(len(live)))))
        else:
            size = int(math.exp(rng.uniform(math.log(512), math.log(max_size))))
            ops.append(MemoryOp("alloc", f"r{i}", size))
            live.append(f"r{i}")
    return ops + [MemoryOp("free", name) for name in live]


def run_sampled(ops: Sequence[MemoryOp], malloc: Callable[[MemoryOp], Any], free: Callable[[Any], None],
                empty_cache: Callable[[], None], stats: Callable[[], tuple[int, int]], oom: type[BaseException],
                after: Callable[[], None] = lambda: None) -> SampledRun:
    """Run ops through any allocator; an allocation that fails with `oom` is skipped (and its free too), the run
    goes on. `stats()` gives (allocated, reserved); `after()` runs after every operation (an invariant check)."""
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
    return SampledRun(samples, first_oom, message)


def run_on_allocator(ops: Sequence[MemoryOp], alloc: CachingAllocator,
                     on_alloc: Callable[[int, MemoryOp], None] | None = None,
                     on_free: Callable[[int, MemoryOp], None] | None = None,
                     after: Callable[[], None] | None = None) -> SampledRun:
    """run_sampled on a minialloc allocator; on_alloc(ptr, op) / on_free(ptr, op) touch the memory when given."""
    made: dict[int, MemoryOp] = {}

    def malloc(ev: MemoryOp) -> int:
        ptr = alloc.malloc(ev.size, ev.stream)
        made[ptr] = ev
        if on_alloc is not None:
            on_alloc(ptr, ev)
        return ptr

    def free(ptr: int) -> None:
        if on_free is not None:
            on_free(ptr, made[ptr])
        alloc.free(ptr)

    return run_sampled(ops, malloc, free, alloc.empty_cache,
                       lambda: (alloc.memory_allocated(), alloc.memory_reserved()), OutOfMemoryError,
                       after if after is not None else lambda: None)


def predict(ops: Sequence[MemoryOp], capacity: int, config: str, fraction: float | None = None) -> SampledRun:
    """minialloc's prediction on a simulated GPU (optionally capped by a memory fraction, as PyTorch is)."""
    alloc = CachingAllocator(SimulatedGPU(capacity), config)
    alloc.record_memory_history(enabled=False)
    if fraction is not None:
        alloc.set_per_process_memory_fraction(fraction)
    return run_on_allocator(ops, alloc)


def first_difference(a: SampledRun, b: SampledRun, names: tuple[str, str]) -> str | None:
    """None when two runs agree at every operation, else where they first part, in words."""
    if a.first_oom != b.first_oom:
        return f"first OOM at event {a.first_oom} ({names[0]}) vs {b.first_oom} ({names[1]})"
    for i, (x, y) in enumerate(zip(a.samples, b.samples, strict=True)):
        if x != y:
            return (f"event {i}: {names[0]} allocated/reserved {format_size(x[0])}/{format_size(x[1])}, "
                    f"{names[1]} {format_size(y[0])}/{format_size(y[1])}")
    return None
