"""Wall-clock helpers the benchmarks and the GPU check share: per-operation cost, rate over a time budget, and
the benchmarks' common command line.

Figures, not tests: they are printed, never asserted on (a loaded machine is slower, not wrong).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

from .workloads import MemoryOp


def time_per_op(ops: Sequence[MemoryOp], malloc: Callable[[int], Any], free: Callable[[Any], None]) -> float:
    """Microseconds per malloc or free over the second of two passes of `ops` (the first fills the cache).

    Only "alloc" and "free" operations; each free must name a live allocation (a trace that frees what it made).
    """
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


def rate(fn: Callable[[], int], seconds: float) -> tuple[float, int]:
    """Call fn (which returns how many units of work it did) until `seconds` have passed: (units per s, units)."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += fn()
    return done / elapsed, done


def once(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(fn's result, the seconds it took): for runs too long to repeat."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """The flags every bench/*.py takes: --quick (a short run, for `make bench BENCH_FLAGS=--quick` and smoke
    tests); a script adds its own sizes. The description is the first line of the script's docstring."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    parser.add_argument("--quick", action="store_true", help="a short run with smaller sizes (figures are rougher)")
    return parser
