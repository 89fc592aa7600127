"""Lab 2 (a fragmentation OOM, and the OOM message's numbers), scored in the grader's process.

The student's trace comes back as plain events and is replayed here on minialloc's CachingAllocator; the
functions of task 2 are called in the sandbox on snapshots made here (random out-of-memory states whose seeds are
drawn at grading time, the canonical scenario's, and the boundary cases of the lab's hidden tests) and compared
with minialloc's own OOM report. The probes are lab2_fragmentation_oom_probes.py.
"""

from __future__ import annotations

import random

from minialloc import CachingAllocator, GiB, MiB, OutOfMemoryError, SimulatedGPU, format_size
from minialloc.workloads import Event, canonical_scenario

from .probe_common import plain, shown

CAPACITY = 8 * GiB
MAX_EVENTS = 10_000
GRADED = ("task1_trace_tests", "task1_expandable_tests", "task2_tried_tests", "task2_reserved_tests",
          "task2_free_tests", "task2_fragmentation_tests")
GRADER_ONLY = ("refs",)  # how the check rebuilds each expected report: kept in the grader's process
EMPTY = {"segments": []}
ONE_FREE = {"segments": [{"total_size": 20 * MiB, "allocated_size": 0, "blocks": [{"size": 20 * MiB,
                                                                                   "state": "inactive"}]}]}


def boundary(cached: int) -> dict:
    """A segment half allocated, its free block of `cached` bytes (the lab's largest-piece boundary cases)."""
    return {"segments": [{"total_size": 40 * MiB, "allocated_size": 20 * MiB,
                          "blocks": [{"size": 20 * MiB, "state": "active_allocated"},
                                     {"size": cached, "state": "inactive"}]}]}


def run_trace(trace: list[Event], config: str = ""):
    """The lab's run_trace: (the allocator, the index of the event that failed or None, the error or None)."""
    allocator = CachingAllocator(SimulatedGPU(CAPACITY), config)
    live: dict[str, int] = {}
    for i, event in enumerate(trace):
        if event.op == "alloc":
            try:
                live[event.name] = allocator.malloc(event.size, event.stream)
            except OutOfMemoryError as error:
                return allocator, i, error
        elif event.op == "free":
            if event.name not in live:
                raise ValueError(f"event {i} frees {event.name!r}, which is not allocated")
            allocator.free(live.pop(event.name))
        elif event.op == "empty_cache":
            allocator.empty_cache()
        else:
            raise ValueError(f"event {i}: unknown op {event.op!r}")
    return allocator, None, None


def random_oom(seed: int, capacity: str = "1GiB"):
    """The lab's random_oom: random mallocs and frees until one fails: (the error, a snapshot, the device's free)."""
    rng = random.Random(seed)
    allocator = CachingAllocator(SimulatedGPU(capacity), "")
    live: list[int] = []
    while True:
        if live and rng.random() < 0.4:
            allocator.free(live.pop(rng.randrange(len(live))))
            continue
        size = rng.choice([rng.randint(1, MiB), rng.randint(1, 12 * MiB), rng.randint(1, 150 * MiB)])
        try:
            live.append(allocator.malloc(size))
        except OutOfMemoryError as error:
            return error, allocator.snapshot(), allocator.device.mem_get_info()[0]


def canonical():
    allocator, _, error = run_trace(canonical_scenario())
    return error, allocator.snapshot(), allocator.device.mem_get_info()[0]


def tried(request: int) -> int:
    """The "Tried to allocate" figure of minialloc's allocator, on a device that refuses every malloc."""
    gpu = SimulatedGPU("8GiB")
    gpu.fail_next_mallocs(3)
    try:
        CachingAllocator(gpu, "").malloc(request)
    except OutOfMemoryError as error:
        return error.report.alloc_size
    raise AssertionError(f"minialloc's allocator did not fail for {request}")


def cases(rng: random.Random, extra: list) -> tuple[list, list]:
    """(calls, refs): [snapshot, device_free] for the probe; how to get the expected report, for the check."""
    calls, refs = [], []
    for _ in range(40):
        seed, capacity = rng.randrange(1 << 30), rng.choice(["256MiB", "1GiB", "600MiB"])
        _, snapshot, free = random_oom(seed, capacity)
        calls.append([snapshot, free])
        refs.append(["oom", seed, capacity])
    _, snapshot, free = canonical()
    calls.append([snapshot, free])
    refs.append(["canonical"])
    for snapshot, free in extra:
        calls.append([snapshot, free])
        refs.append(["fixed"])
    return calls, refs


def inputs(grade_id: str, rng: random.Random) -> dict:
    if grade_id in ("task1_trace_tests", "task1_expandable_tests"):
        return {}
    if grade_id == "task2_tried_tests":
        edges = {b + d for b in (512, MiB, 2 * MiB, 10 * MiB, 12 * MiB, 20 * MiB, 2 * GiB)
                 for d in (-512, -1, 0, 1, 512) if b + d > 0} | {1, 3 * MiB, 11 * MiB + 1, 10 * MiB - 512}
        sizes = sorted(edges) + [random_oom(rng.randrange(1 << 30))[0].report.requested_size for _ in range(40)]
        return {"sizes": sizes}
    extra = {"task2_reserved_tests": [(EMPTY, 0)],
             "task2_free_tests": [(EMPTY, 0), (EMPTY, 6 * MiB), (boundary(20 * MiB), 20 * MiB),
                                  (boundary(20 * MiB), 20 * MiB - 1), (boundary(20 * MiB), 20 * MiB + 1)],
             "task2_fragmentation_tests": [(ONE_FREE, 0), (ONE_FREE, 20 * MiB), (EMPTY, 0), (EMPTY, 512)]}[grade_id]
    calls, refs = cases(rng, extra)
    return {"calls": calls, "refs": refs}



def check(grade_id: str, args: dict, result) -> str | None:
    if grade_id in ("task1_trace_tests", "task1_expandable_tests"):
        return check_trace(grade_id, result)
    if grade_id == "task2_tried_tests":
        for size, got in zip(args["sizes"], result, strict=True):
            want = tried(size)
            if got != plain(want):
                return f"tried_to_allocate({size}) returned {shown(got)}, expected {want}"
        return None
    for (snapshot, free), ref, got in zip(args["calls"], args["refs"], result, strict=True):
        report = (random_oom(ref[1], ref[2]) if ref[0] == "oom" else canonical())[0].report if ref[0] != "fixed" \
            else None
        where = "a random out-of-memory snapshot" if ref[0] == "oom" else "the canonical scenario's snapshot" \
            if ref[0] == "canonical" else f"the snapshot {snapshot!r} with {free} bytes free on the device"
        if grade_id == "task2_reserved_tests":
            want = report.reserved_unallocated if report else 0
            if got != want:
                return f"reserved_but_unallocated on {where} returned {shown(got)}, expected {want}"
        elif grade_id == "task2_free_tests":
            if report:
                want_largest, want_total = report.largest_free_block, report.total_free
            else:
                cached = [b["size"] for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "inactive"]
                want_largest, want_total = max([free, *cached]), free + sum(
                    s["total_size"] - s["allocated_size"] for s in snapshot["segments"])
            if got[0] != want_largest:
                return f"largest_free_block on {where} returned {shown(got[0])}, expected {want_largest}"
            if got[1] != want_total:
                return f"total_free on {where} returned {shown(got[1])}, expected {want_total}"
        else:
            if report:
                want = report.fragmentation
                if type(got) is not float or abs(got - want) >= 1e-9:
                    return f"fragmentation on {where} returned {shown(got)}, expected {want}"
            else:
                total = free + sum(s["total_size"] - s["allocated_size"] for s in snapshot["segments"])
                cached = [b["size"] for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "inactive"]
                want = 0.0 if total == 0 else 1.0 - max([free, *cached]) / total
                if type(got) is not float or got != want:
                    return f"fragmentation on {where} returned {shown(got)}, expected {want}"
    return None


def check_trace(grade_id: str, result) -> str | None:
    if not isinstance(result, list) or not result:
        return "fragmenting_trace() returned no events"
    if len(result) > MAX_EVENTS:
        return f"the trace has more than {MAX_EVENTS} events"
    trace = [Event(op, name, size, stream) for op, name, size, stream in result]
    try:
        _, failed_at, error = run_trace(trace)
    except ValueError as problem:
        return f"the trace cannot be replayed: {problem}"
    if failed_at is None:
        return "every event succeeded: the last one must fail"
    if failed_at != len(trace) - 1:
        return f"event {failed_at} failed, before the last one"
    if grade_id == "task1_expandable_tests":
        _, failed_at, error = run_trace(trace, "expandable_segments:True")
        return None if failed_at is None else f"with expandable segments event {failed_at} still fails: {error}"
    if trace[-1].op != "alloc" or trace[-1].size != 2 * GiB:
        return "the last event must ask for 2 GiB"
    if any(e.stream != 0 for e in trace):
        return "every event must be on the default stream"
    report = error.report
    if report.allocated > GiB:
        return f"{format_size(report.allocated)} allocated: at most 1 GiB"
    if report.reserved_unallocated < 4 * GiB:
        return f"{format_size(report.reserved_unallocated)} cached: at least 4 GiB"
    if report.total_free < 6 * GiB:
        return f"{format_size(report.total_free)} free in all: at least 6 GiB"
    _, failed_at, _ = run_trace(trace[:-1] + [Event("empty_cache"), trace[-1]])
    if failed_at != len(trace):
        return "empty_cache before the request must not rescue it"
    return None
