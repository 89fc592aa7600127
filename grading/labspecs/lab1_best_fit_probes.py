"""Lab 1's probes: run in the grading sandbox after the cells before each graded test cell (probe_common.py is
prepended). Each calls the student's code on the grader's inputs and returns plain data; no expected value is here.
"""

from minialloc import SimulatedGPU

if __name__ != "grader_probes":  # read as a module (linting, tests); in the sandbox probe_common.py comes first
    from .probe_common import call, construct, need, raised


def task1_sizes_tests(ns, args):
    round_size, is_small, segment_size = need(ns, "round_size"), need(ns, "is_small"), need(ns, "segment_size")
    return {"round_size": [call(round_size, s) for s in args["sizes"]],
            "is_small": [call(is_small, r) for r in args["classified"]],
            "segment_size": [call(segment_size, r) for r in args["classified"]]}


def task2_best_fit_tests(ns, args):
    best_fit, should_split = need(ns, "best_fit"), need(ns, "should_split")
    fits = [call(best_fit, [tuple(b) for b in free], want) for free, want in args["best_fit"]]
    splits = [call(should_split, block, size, small) for block, size, small in args["should_split"]]
    return {"best_fit": fits, "should_split": splits}


def _trace(cls, trace, retry):
    """One trace on a fresh allocator: an observation after every step, then the free blocks."""
    gpu = SimulatedGPU(trace["capacity"])
    mine, failed = construct(cls, gpu)
    if failed:
        return {"init": failed}
    ptrs, steps = [], []
    for op, arg in trace["ops"]:
        if op == "malloc":
            got = call(mine.malloc, arg)
            ptrs.append(got if type(got) is int else None)
        elif op == "free":
            got = None if ptrs[arg] is None else call(mine.free, ptrs[arg])
        else:
            got = call(mine.release_cached_blocks)
        seen = [got, call(getattr, mine, "reserved_bytes"), call(getattr, mine, "allocated_bytes")]
        if retry:
            seen += [call(getattr, mine, "num_alloc_retries"), [gpu.num_mallocs, gpu.num_frees]]
        if trace.get("blocks_each_step"):
            seen.append(call(mine.free_blocks))
        steps.append(seen)
        if raised(got) and not (retry and got["memory"]):
            break  # the first failure decides; the rest would compare a broken state
    return {"steps": steps, "free_blocks": call(mine.free_blocks)}


def traces(ns, args):
    cls = need(ns, args["class"])
    return [_trace(cls, trace, args["class"] == "RetryingAllocator") for trace in args["traces"]]


task3_malloc_tests = task3_free_tests = task3_trace_tests = task4_retry_tests = traces
