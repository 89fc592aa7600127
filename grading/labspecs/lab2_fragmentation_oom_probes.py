"""Lab 2's probes: run in the grading sandbox after the cells before each graded test cell (probe_common.py is
prepended). A trace comes back as plain events; the functions of task 2 are called on the grader's snapshots.
"""

if __name__ != "grader_probes":  # read as a module (linting, tests); in the sandbox probe_common.py comes first
    from .probe_common import call, need


def _events(trace):
    """The student's trace as plain events (a trace is data): [op, name, size, stream] each, at most 10 000."""
    return [[str(e.op), str(e.name), int(e.size), int(e.stream)] for e in list(trace)[:10001]]


def task1_trace_tests(ns, args):
    return _events(need(ns, "fragmenting_trace")())


task1_expandable_tests = task1_trace_tests


def task2_tried_tests(ns, args):
    tried = need(ns, "tried_to_allocate")
    return [call(tried, size) for size in args["sizes"]]


def task2_reserved_tests(ns, args):
    reserved = need(ns, "reserved_but_unallocated")
    return [call(reserved, snapshot) for snapshot, _free in args["calls"]]


def task2_free_tests(ns, args):
    largest, total = need(ns, "largest_free_block"), need(ns, "total_free")
    return [[call(largest, snapshot, free), call(total, snapshot, free)] for snapshot, free in args["calls"]]


def task2_fragmentation_tests(ns, args):
    fragmentation = need(ns, "fragmentation")
    return [call(fragmentation, snapshot, free) for snapshot, free in args["calls"]]
