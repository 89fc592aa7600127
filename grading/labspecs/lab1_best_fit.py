"""Lab 1 (best fit, splitting and merging, release and retry), scored in the grader's process.

`inputs(grade_id, rng)` chooses what the probe of a graded test cell runs (the visible tests' cases, the hidden
tests' boundaries, and random traces whose seeds `rng` draws at grading time); `check(grade_id, args, result)`
compares the probe's data with references computed here with minialloc's CachingAllocator: None when they agree,
else the first difference, worded as the lab's own tests word it. The probes are lab1_best_fit_probes.py.
"""

from __future__ import annotations

import random

from minialloc import CachingAllocator, KiB, MiB, SimulatedGPU
from minialloc.allocator import get_allocation_size, round_size

from .probe_common import plain, raised, shown

GiB = 1024 * MiB
K_SMALL_SIZE = MiB
CLASS = {"task3_malloc_tests": "BestFitAllocator", "task3_free_tests": "BestFitAllocator",
         "task3_trace_tests": "BestFitAllocator", "task4_retry_tests": "RetryingAllocator"}
GRADED = ("task1_sizes_tests", "task2_best_fit_tests", *CLASS)


def random_ops(rng: random.Random, n: int = 300, sizes: tuple[int, ...] = (4 * KiB, 300 * KiB, 3 * MiB, 24 * MiB)):
    """The lab's random_ops (helpers cell), drawing from `rng`: mallocs near the given sizes, frees of live blocks."""
    ops: list[tuple[str, int]] = []
    live: list[int] = []
    mallocs = 0
    for _ in range(n):
        if live and rng.random() < 0.45:
            ops.append(("free", live.pop(rng.randrange(len(live)))))
        else:
            size = rng.choice(sizes)
            if rng.random() < 0.7:
                size = max(1, int(size * rng.uniform(0.2, 1.5)))
            ops.append(("malloc", size))
            live.append(mallocs)
            mallocs += 1
    return ops


def mallocs(*sizes: int) -> list[tuple[str, int]]:
    return [("malloc", s) for s in sizes]


def trace(ops, capacity: str = "80GiB", blocks_each_step: bool = False) -> dict:
    return {"ops": [list(op) for op in ops], "capacity": capacity, "blocks_each_step": blocks_each_step}


def inputs(grade_id: str, rng: random.Random) -> dict:
    if grade_id == "task1_sizes_tests":
        edges = {b + d for b in (512, 1024, K_SMALL_SIZE, 2 * MiB, 10 * MiB, 12 * MiB, 20 * MiB, 2 * GiB)
                 for d in (-512, -1, 0, 1, 512) if b + d > 0} | {1, 513, 3 * MiB, 11 * MiB + 512}
        sizes = sorted(edges) + [rng.randint(1, 64 * MiB) for _ in range(2000)]
        # is_small and segment_size take rounded sizes: their own, drawn apart from `sizes` (the rounded `sizes`
        # would be round_size's answers, and the sandbox must hold no expected value)
        rounded = sorted({512 * max(1, b // 512 + d) for b in (512, 1024, K_SMALL_SIZE, 2 * MiB, 10 * MiB, 12 * MiB,
                                                               20 * MiB, 2 * GiB) for d in (-1, 0, 1)})
        rounded += [512 * rng.randint(1, 128 * 1024) for _ in range(2000)]
        return {"sizes": sizes, "classified": rounded}
    if grade_id == "task2_best_fit_tests":
        visible = [(1024, 0x300), (4096, 0x100), (4096, 0x200), (8192, 0x000)]
        fits = [[visible, w] for w in (512, 2048, 8192, 8704)] + [[[], 512]]
        for _ in range(300):
            free = sorted({(rng.choice([512, 1024, 4096, 2 * MiB]) * rng.randint(1, 4), rng.randrange(0, 1 << 20, 512))
                           for _ in range(rng.randint(0, 12))})
            fits.append([free, rng.choice([512, 1024, 4096, 2 * MiB]) * rng.randint(1, 5)])
        splits = [[2 * MiB, 2 * MiB - 512, True], [2 * MiB, 2 * MiB, True], [20 * MiB, 3 * MiB, False],
                  [20 * MiB, 19 * MiB, False]]
        for small, block in ((True, 2 * MiB), (False, 20 * MiB), (False, 64 * MiB)):
            step = 512 * rng.randint(17, 61)
            splits += [[block, size, small] for size in range(512, block + 1, step)]
        for small, block, rem in ((True, 2 * MiB, 0), (True, 2 * MiB, 512), (True, MiB, 1024),
                                  (False, 20 * MiB, MiB - 512), (False, 20 * MiB, MiB), (False, 20 * MiB, MiB + 512),
                                  (False, 12 * MiB, 0), (False, 64 * MiB, 2 * MiB)):
            splits.append([block, block - rem, small])
        return {"best_fit": fits, "should_split": splits}
    seed = lambda: rng.randrange(1 << 30)  # noqa: E731 -- a fresh seed per trace, drawn at grading time
    if grade_id == "task3_malloc_tests":
        traces = [trace(mallocs(3 * MiB, 1000, 16 * MiB), blocks_each_step=True),
                  trace(mallocs(1, 512, 513, MiB, MiB + 1, 10 * MiB, 19 * MiB, 700 * KiB, 7 * MiB))]
        traces += [trace([op for op in random_ops(random.Random(seed()), 150) if op[0] == "malloc"]) for _ in range(3)]
        traces += [trace(mallocs(1, 511, 512, 513, MiB - 512, MiB, MiB + 1, 10 * MiB - 512, 10 * MiB, 10 * MiB + 512,
                                 19 * MiB, 19 * MiB - 512, 19 * MiB + 512, 2 * MiB - 512, 2 * MiB - 1024, 20 * MiB)),
                   trace(mallocs(3 * MiB, 16 * MiB - 512, 512, 2 * MiB - 512, 512))]
    elif grade_id == "task3_free_tests":
        filled = [("malloc", 2 * MiB)] * 40 + [("free", k) for k in range(0, 40, 2)] + [("malloc", 3 * MiB)]
        filled += [("free", k) for k in range(1, 40, 2)] + mallocs(19 * MiB, 18 * MiB)
        traces = [trace([*mallocs(4 * MiB, 4 * MiB, 4 * MiB), ("free", 1), ("free", 2), ("free", 0)],
                        blocks_each_step=True),
                  trace([*mallocs(4 * MiB, 4 * MiB, 4 * MiB), ("free", 1), ("free", 0), ("malloc", 8 * MiB),
                         ("free", 2), ("malloc", 12 * MiB)]),
                  trace([*mallocs(600 * KiB, 600 * KiB, 300 * KiB), ("free", 0), ("free", 2), ("free", 1),
                         *mallocs(2 * MiB, MiB)], blocks_each_step=True),
                  trace(filled)]
    elif grade_id == "task3_trace_tests":
        edge = (512, MiB - 512, MiB, MiB + 512, 2 * MiB, 9 * MiB, 10 * MiB - 512, 10 * MiB, 19 * MiB, 20 * MiB,
                21 * MiB)
        traces = [trace(random_ops(random.Random(0)))]  # the visible test: random_ops(seed=0)
        traces += [trace(random_ops(random.Random(seed()), 400)) for _ in range(3)]
        traces += [trace(random_ops(random.Random(seed()), 400, edge)) for _ in range(2)]
        traces.append(trace(random_ops(random.Random(seed()), 300, (100 * MiB, 64 * MiB, 2 * MiB))))
    elif grade_id == "task4_retry_tests":
        edge = (512, MiB, MiB + 512, 2 * MiB, 10 * MiB - 512, 10 * MiB, 20 * MiB, 21 * MiB)
        traces = [trace([*mallocs(30 * MiB, 20 * MiB), ("free", 0), *mallocs(40 * MiB, 8 * MiB), ("free", 1),
                         ("release", 0)], "64MiB", blocks_each_step=True),
                  trace([*mallocs(30 * MiB, 20 * MiB), ("free", 0), *mallocs(40 * MiB, 8 * MiB, 1000), ("free", 1),
                         ("malloc", 24 * MiB)], "64MiB"),
                  trace([*mallocs(3 * MiB, 300 * KiB), ("free", 1), *mallocs(22 * MiB, 1000, 40 * MiB), ("free", 0),
                         *mallocs(40 * MiB, 20 * MiB)], "64MiB"),
                  trace([("malloc", 32 * MiB), ("free", 0), *mallocs(32 * MiB, 32 * MiB + 1), ("free", 2),
                         *mallocs(64 * MiB, 512), ("free", 1), ("malloc", 64 * MiB)], "64MiB")]
        traces += [trace(random_ops(random.Random(seed()), 300), cap) for cap in ("64MiB", "100MiB", "256MiB", "40MiB")]
        traces.append(trace(random_ops(random.Random(seed()), 300, edge), "64MiB"))
    else:
        raise KeyError(f"lab1_best_fit has no graded test cell {grade_id!r}")
    return {"class": CLASS[grade_id], "traces": traces}



def check(grade_id: str, args: dict, result) -> str | None:
    """None when the probe's data agree with the references, else the first difference."""
    if grade_id == "task1_sizes_tests":
        if not isinstance(result, dict) or set(result) != {"round_size", "is_small", "segment_size"}:
            return "the probe returned no result for every size"
        cases = [("round_size", args["sizes"], lambda s: round_size(s, 0)),
                 ("is_small", args["classified"], lambda r: r <= K_SMALL_SIZE),
                 ("segment_size", args["classified"], get_allocation_size)]
        for name, given, reference in cases:
            got = result[name]
            if not isinstance(got, list) or len(got) != len(given):
                return f"the probe returned no result of {name} for every size"
            for arg, g in zip(given, got, strict=True):
                want = reference(arg)
                if g != plain(want):
                    return f"{name}({arg}) returned {shown(g)}, expected {want}"
        return None
    if grade_id == "task2_best_fit_tests":
        for (free, want), got in zip(args["best_fit"], result["best_fit"], strict=True):
            fits = [i for i, (s, _p) in enumerate(free) if s >= want]
            expected = min(fits, key=lambda i: free[i]) if fits else None
            if got != expected:
                return f"best_fit({[tuple(b) for b in free]}, {want}) returned {shown(got)}, expected {expected}"
        for (block, size, small), got in zip(args["should_split"], result["should_split"], strict=True):
            expected = block - size >= 512 if small else block - size > MiB
            if got is not expected:
                return f"should_split({block}, {size}, small={small}) returned {shown(got)}, expected {expected}"
        return None
    retry = args["class"] == "RetryingAllocator"
    for number, (spec, got) in enumerate(zip(args["traces"], result, strict=True)):
        problem = compare_trace(args["class"], spec, got, reference_trace(spec, retry), retry)
        if problem:
            return f"trace {number + 1} of {len(args['traces'])}: {problem}"
    return None


def reference_trace(spec: dict, retry: bool) -> dict:
    """The same trace on minialloc's CachingAllocator, observed as the probe observes the student's allocator."""
    gpu = SimulatedGPU(spec["capacity"])
    ref = CachingAllocator(gpu, "")
    ptrs: list[int | None] = []
    steps = []
    for op, arg in spec["ops"]:
        if op == "malloc":
            try:
                got = ref.malloc(arg)
            except MemoryError:
                got = {"!raised": "MemoryError", "memory": True}
            ptrs.append(got if type(got) is int else None)
        elif op == "free":
            got = None
            if ptrs[arg] is not None:
                ref.free(ptrs[arg])
        else:
            before = ref.memory_reserved()
            ref.empty_cache()
            got = before - ref.memory_reserved()
        seen = [got, ref.memory_reserved(), ref.memory_allocated()]
        if retry:
            seen += [ref.memory_stats()["num_alloc_retries"], [gpu.num_mallocs, gpu.num_frees]]
        if spec.get("blocks_each_step"):
            seen.append(free_blocks(ref))
        steps.append(seen)
    return {"steps": steps, "free_blocks": free_blocks(ref)}


def free_blocks(ref: CachingAllocator):
    blocks = sorted((b["address"], b["size"]) for seg in ref.snapshot()["segments"] for b in seg["blocks"]
                    if b["state"] == "inactive")
    return plain(blocks)


def compare_trace(cls: str, spec: dict, got, want: dict, retry: bool) -> str | None:
    if not isinstance(got, dict):
        return "no observation came back"
    if "init" in got:
        return f"{cls}(device) {shown(got['init'])}"
    names = ["returned", "reserved_bytes", "allocated_bytes"] + (["num_alloc_retries", "device mallocs and frees"]
                                                                 if retry else []) + ["free_blocks()"]
    steps = got.get("steps")
    if not isinstance(steps, list):
        return "no observation came back"
    for step, (op, want_seen) in enumerate(zip(spec["ops"], want["steps"], strict=True)):
        if step >= len(steps):
            return f"step {step} ({op[0]} {op[1]}) was not reached"
        seen = steps[step]
        if not isinstance(seen, list) or len(seen) != len(want_seen):
            return f"step {step}: the observation is incomplete"
        for name, g, w in zip(names, seen, want_seen, strict=False):
            if raised(w) and raised(g) and g["memory"]:
                continue  # out of memory on both sides
            if g != w:
                what = f"{op[0]}({op[1]})" if op[0] != "release" else "release_cached_blocks()"
                if name == "returned":
                    return f"step {step}: {what} {shown(g) if raised(g) else 'returned ' + shown(g)}, " \
                           f"minialloc {'ran out of memory' if raised(w) else 'returned ' + shown(w)}"
                return f"after step {step} ({what}): {name} {shown(g)}, minialloc {shown(w)}"
    if got.get("free_blocks") != want["free_blocks"]:
        return "the free blocks differ at the end: are neighbours merged?"
    return None
