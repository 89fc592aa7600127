"""Lab 3 (what a trace costs in pages and driver calls, one contiguous range, an expandable segment), scored in the
grader's process.

The costs of a trace are compared, step by step, with what a counting device saw when minialloc's allocator (with
expandable segments) played the trace's requests; the contiguous range with what the simulator's page table must
hold; the expandable segment, step by step, with minialloc's ExpandableSegment on a device of the same size (what
each call returned, the pages mapped, the device's free memory, the handles kept, access). The cases are the lab's
visible and hidden ones, and random ones whose seeds are drawn at grading time. The probes are
lab3_page_mapping_probes.py.
"""

from __future__ import annotations

import random

from minialloc import CachingAllocator, MiB, SimulatedGPU
from minialloc.expandable import ExpandableSegment

from .probe_common import plain, raised, shown

PAGE = 2 * MiB
GRADED = ("task1_costs_tests", "task2_contiguous_tests", "task3_map_tests", "task3_unmap_tests",
          "task3_random_tests")


class CountingGPU(SimulatedGPU):
    """A simulated GPU that counts the driver calls behind pages (the lab's CountingGPU)."""

    def __init__(self, capacity: str) -> None:
        super().__init__(capacity)
        self.calls = 0

    def mem_create(self, size: int) -> int:
        self.calls += 1
        return super().mem_create(size)

    def mem_map(self, va: int, size: int, offset: int, handle: int) -> None:
        self.calls += 1
        super().mem_map(va, size, offset, handle)

    def mem_set_access(self, va: int, size: int) -> None:
        self.calls += 1
        super().mem_set_access(va, size)

    def mem_unmap(self, va: int, size: int) -> None:
        self.calls += 1
        super().mem_unmap(va, size)

    def mem_release(self, handle: int) -> None:
        self.calls += 1
        super().mem_release(handle)


def play(requests: list, page_mb: int) -> tuple[list[list], list[tuple[int, int]]]:
    """The lab's play(): the trace the allocator's expandable segment saw for these requests, and after each step
    (pages mapped, driver calls the step made) as the device counted them."""
    gpu = CountingGPU("8GiB")
    allocator = CachingAllocator(gpu, f"expandable_segments:True,large_segment_size_mb:{page_mb}")
    live: dict[str, int] = {}
    trace: list[list] = []
    counted: list[tuple[int, int]] = []
    for request in requests:
        calls = gpu.calls
        if request[0] == "alloc":
            live[request[1]] = allocator.malloc(request[2])
            trace.append(["alloc", live[request[1]] - allocator.expandable_segments[0].ptr, request[2]])
        elif request[0] == "free":
            ptr = live.pop(request[1])
            trace.append(["free", ptr - allocator.expandable_segments[0].ptr])
            allocator.free(ptr)
        else:
            allocator.empty_cache()
            trace.append(["empty_cache"])
        assert len(allocator.expandable_segments) <= 1, "a lab 3 trace outgrew one segment's range"
        counted.append((allocator.memory_reserved() // (page_mb * MiB), gpu.calls - calls))
    return trace, counted


def random_requests(rng: random.Random, n: int) -> list[list]:
    """The lab's random_requests: allocs of 1 to 90 MiB, frees of live blocks, now and then an empty_cache."""
    requests: list[list] = []
    live: list[str] = []
    for k in range(n):
        r = rng.random()
        if r < 0.08:
            requests.append(["empty_cache"])
        elif live and r < 0.45:
            requests.append(["free", live.pop(rng.randrange(len(live)))])
        else:
            live.append(f"t{k}")
            requests.append(["alloc", f"t{k}", rng.randrange(MiB + 512, 90 * MiB, 512)])
    return requests


# the lab's visible and hidden cases: chapter 3's story; a free page between two unmapped runs (two
# cuMemSetAccess calls); blocks ending on page boundaries, and the range given back and started again
STORY = [["alloc", "a", 30 * MiB], ["alloc", "b", 15 * MiB], ["free", "a"], ["empty_cache"], ["alloc", "c", 10 * MiB]]
TWO_RUNS = [["alloc", "a", 140 * MiB], ["alloc", "b", 20 * MiB], ["alloc", "c", 40 * MiB], ["alloc", "d", 20 * MiB],
            ["free", "a"], ["free", "c"], ["empty_cache"], ["free", "b"], ["alloc", "e", 200 * MiB]]
BOUNDARIES = [["alloc", "a", 20 * MiB], ["alloc", "b", 20 * MiB], ["alloc", "c", 25 * MiB], ["free", "b"],
              ["empty_cache"], ["free", "a"], ["empty_cache"], ["free", "c"], ["empty_cache"], ["alloc", "d", 50 * MiB],
              ["alloc", "e", 10 * MiB]]


def costs_case(requests: list, page_mb: int) -> dict:
    """A case for the probe: the requests (the check replays them) and the trace the student's function reads."""
    return {"requests": requests, "page_mb": page_mb, "trace": play(requests, page_mb)[0]}


def random_ops(seed: int, n: int, max_pages: int, free_pages: int, page_size: int = PAGE, unmaps: bool = True):
    """The lab's random_ops (valid maps and unmaps), a third or so of them ending exactly on page boundaries."""
    rng = random.Random(seed)
    mapped = [False] * max_pages
    ops = []
    for _ in range(n):
        runs, i = [], 0
        while i < max_pages:
            j = i
            while j < max_pages and mapped[j] == mapped[i]:
                j += 1
            runs.append((mapped[i], i, j))
            i = j
        state, first, end = rng.choice([r for r in runs if unmaps or not r[0]])
        room = min(end - first, free_pages - sum(mapped))
        if not state and room > 0:
            start = rng.randrange(first, first + room)
            size = rng.randint(1, (first + room - start) * page_size)
            if rng.random() < 0.4:
                size = -(-size // page_size) * page_size
            ops.append(["map", start * page_size, size])
            for p in range(start, start - (-size // page_size)):
                mapped[p] = True
        elif state:
            lo = rng.randrange(first * page_size, end * page_size, 512)
            hi = rng.randrange(lo + 512, end * page_size + 1, 512)
            if rng.random() < 0.4:  # on page boundaries
                lo, hi = lo - lo % page_size, max(hi - hi % page_size, lo - lo % page_size + page_size)
            ops.append(["unmap", lo, hi - lo])
            for p in range(-(-lo // page_size), hi // page_size):
                mapped[p] = False
    return ops


def trace(ops, capacity: str = "64MiB", page_size: int = PAGE) -> dict:
    return {"ops": [list(op) for op in ops], "capacity": capacity, "page_size": page_size}


def inputs(grade_id: str, rng: random.Random) -> dict:
    if grade_id == "task1_costs_tests":
        cases = [costs_case(STORY, 20), costs_case(random_requests(random.Random(0), 80), 20),
                 costs_case(random_requests(random.Random(1), 80), 64), costs_case(TWO_RUNS, 20),
                 costs_case(BOUNDARIES, 20)]
        cases += [costs_case(random_requests(random.Random(rng.randrange(1 << 30)), 120), page_mb)
                  for page_mb in (20, 12, 64, 20, 12, 64)]
        return {"cases": cases}
    if grade_id == "task2_contiguous_tests":
        cases = [{"handles": [3, 1], "pages": [[1, 0], [0, 2], [0, 0]], "other": False}]
        for _ in range(30):
            counts = [rng.randint(1, 4) for _ in range(5)]
            every = [[h, i] for h, n in enumerate(counts) for i in range(n)]
            cases.append({"handles": counts, "pages": rng.sample(every, rng.randint(1, len(every))), "other": True})
        return {"cases": cases}
    if grade_id == "task3_map_tests":
        traces = [trace([["map", 0, 3 * MiB], ["map", 5 * PAGE, PAGE], ["map", 6 * PAGE, 30 * PAGE]]),
                  trace([["map", 0, 1], ["map", 4 * PAGE, 7 * MiB], ["map", 8 * PAGE, 40 * PAGE]]),
                  trace([["fail", 1, 0], ["map", 0, 4 * PAGE], ["map", 0, 4 * PAGE]]),
                  trace([["map", 0, PAGE], ["map", PAGE, PAGE + 1], ["map", 3 * PAGE, 2 * PAGE - 1],
                         ["map", 5 * PAGE, 27 * PAGE], ["map", 32 * PAGE, 1]]),
                  trace([["map", 0, 32 * PAGE - 512], ["unmap", 0, 32 * PAGE - 512], ["map", 0, 31 * PAGE],
                         ["map", 32 * PAGE, 1]]),
                  trace(random_ops(rng.randrange(1 << 30), 40, 36, 32, unmaps=False)),
                  trace([["map", 0, 20 * MiB], ["map", 20 * MiB, 1], ["map", 60 * MiB, 50 * MiB]], "200MiB", 20 * MiB)]
    elif grade_id == "task3_unmap_tests":
        traces = [trace([["map", 0, 4 * PAGE], ["unmap", MiB, 2 * PAGE], ["unmap", 2 * PAGE + MiB, MiB]]),
                  trace([["map", 0, 4 * PAGE], ["unmap", MiB, 2 * PAGE], ["unmap", 2 * PAGE, 2 * PAGE]]),
                  trace([["map", 0, 10 * PAGE], ["unmap", 512, 10 * PAGE - 512], ["unmap", 0, PAGE + 512],
                         ["map", PAGE, 8 * PAGE], ["unmap", PAGE - 512, 8 * PAGE + 1024]]),
                  trace([["map", 0, 60 * MiB], ["unmap", 10 * MiB, 30 * MiB], ["map", 20 * MiB, 1]], "200MiB",
                        20 * MiB),
                  trace([["map", 0, 12 * PAGE], ["unmap", 0, PAGE], ["unmap", PAGE, PAGE - 512],
                         ["unmap", 2 * PAGE + 512, PAGE], ["unmap", 4 * PAGE - 512, 2 * PAGE + 512],
                         ["unmap", 7 * PAGE, 2 * PAGE + 512], ["unmap", 10 * PAGE - 512, 2 * PAGE + 512]])]
    elif grade_id == "task3_random_tests":
        traces = [trace(random_ops(0, 60, 36, 32))]  # the visible test's size; its seed's exact ops are the lab's
        traces += [trace(random_ops(rng.randrange(1 << 30), 80, 36, 32)) for _ in range(8)]
        traces += [trace(random_ops(rng.randrange(1 << 30), 60, 12, 10, 20 * MiB), "200MiB", 20 * MiB)
                   for _ in range(3)]
    else:
        raise KeyError(f"lab3_page_mapping has no graded test cell {grade_id!r}")
    return {"traces": traces}


def check(grade_id: str, args: dict, result) -> str | None:
    if grade_id == "task1_costs_tests":
        for number, (case, got) in enumerate(zip(args["cases"], result, strict=True)):
            problem = check_costs(case, got)
            if problem:
                return f"trace {number + 1} of {len(args['cases'])}: {problem}"
        return None
    if grade_id == "task2_contiguous_tests":
        for case, got in zip(args["cases"], result, strict=True):
            problem = check_contiguous(case, got)
            if problem:
                return problem
        return None
    for number, (spec, got) in enumerate(zip(args["traces"], result, strict=True)):
        problem = compare_segment(spec, got)
        if problem:
            return f"trace {number + 1} of {len(args['traces'])}: {problem}"
    return None

def check_costs(case: dict, got) -> str | None:
    trace, counted = play(case["requests"], case["page_mb"])
    if raised(got):
        return f"page_costs({case['page_mb'] * MiB}, trace) {shown(got)}"
    if not isinstance(got, list) or len(got) != len(trace):
        return f"page_costs returned {shown(got)[:200]}, expected a list of {len(trace)} pairs"
    for step, (op, seen, want) in enumerate(zip(trace, got, counted, strict=True)):
        if seen != plain(want):
            return f"step {step}, {tuple(op)}: page_costs returned {shown(seen)}, the device counted {want}"
    return None


def check_contiguous(case: dict, got) -> str | None:
    gpu = SimulatedGPU("1GiB")  # the same handles, made in the same order: the simulator numbers them alike
    handles = [gpu.mem_create(n * PAGE) for n in case["handles"]]
    pages = [plain((handles[h], i * PAGE)) for h, i in case["pages"]]
    va = got.get("va")
    if type(va) is not int:
        return f"map_contiguous returned {shown(va)}, expected the range's address"
    if case["other"] and va == got.get("other"):
        return "map_contiguous mapped into an address range it did not reserve"
    for k, (seen, want) in enumerate(zip(got["mapping"], pages, strict=True)):
        if seen != want:
            return f"virtual page {k} maps {shown(seen)}, expected {shown(want)}"
    if not all(a is True for a in got["access"]):
        return f"virtual page {got['access'].index(False)} is mapped but not accessible"
    if got["mapped"] != len(pages) or got["free"] != 0:
        return f"{got['mapped']} pages mapped and the free memory changed by {got['free']}: expected {len(pages)} " \
               "and no change (mapping costs no memory)"
    if got["unmap"] is not None or got["release"] is not None:
        return f"the range cannot be unmapped and freed as exactly {len(pages)} pages: did it reserve more?"
    return None


def compare_segment(spec: dict, got) -> str | None:
    if not isinstance(got, dict):
        return "no observation came back"
    if "init" in got:
        return f"MiniExpandableSegment(device, {spec['page_size']}) {shown(got['init'])}"
    gpu = SimulatedGPU(spec["capacity"])
    page_size = spec["page_size"]
    ref = ExpandableSegment(gpu, 0, page_size)
    if got.get("start") != [ref.ptr, ref.max_pages]:
        return f"ptr and max_pages are {got.get('start')}, ExpandableSegment's {[ref.ptr, ref.max_pages]}"
    steps = got.get("steps")
    number = 0
    for op, offset, size in spec["ops"]:
        if op == "fail":
            gpu.fail_next_mallocs(offset)
            continue
        want = plain(getattr(ref, op)(ref.ptr + offset, size))
        pages = sorted({(va - ref.ptr) // page_size for va in gpu.mapped_addresses() if va >= ref.ptr})
        if not isinstance(steps, list) or number >= len(steps) or not isinstance(steps[number], list) \
                or len(steps[number]) != 5:
            return f"step {number} ({op} +{offset}, {size}) was not reached"
        returned, seen_pages, info, handles, access = steps[number]
        where = f"step {number}, {op}(+{offset}, {size})"
        if returned != want:
            return f"{where}: returned {shown(returned)}, ExpandableSegment {shown(want)}"
        if seen_pages != pages:
            return f"{where}: mapped pages {seen_pages}, ExpandableSegment {pages}"
        if info != list(gpu.mem_get_info()):
            return f"{where}: device free memory differs"
        if handles != pages:
            return f"{where}: handles {shown(handles)} for mapped pages {pages}"
        if access is not True:
            return f"{where}: a mapped page is not accessible"
        number += 1
    return None
