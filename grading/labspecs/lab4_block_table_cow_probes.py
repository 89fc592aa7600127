"""Lab 4's probes: run in the grading sandbox after the cells before each graded test cell (probe_common.py is
prepended). The block manager's state comes back after every operation, as plain data.
"""

if __name__ != "grader_probes":  # read as a module (linting, tests); in the sandbox probe_common.py comes first
    from .probe_common import call, construct, need, raised


def task1_addressing_tests(ns, args):
    blocks_needed, slot_of = need(ns, "blocks_needed"), need(ns, "slot_of")
    return {"blocks_needed": [call(blocks_needed, n, bs) for n, bs in args["blocks_needed"]],
            "slot_of": [call(slot_of, table, pos, bs) for table, pos, bs in args["slot_of"]]}


def _state(manager):
    """What the lab's side_by_side compares after each operation."""
    return [call(lambda: manager.tables), call(lambda: manager.num_tokens), call(lambda: list(manager.ref_cnt)),
            call(lambda: list(manager.free_queue))]


def _run(cls, trace):
    manager, failed = construct(cls, trace["num_blocks"], trace["block_size"])
    if failed:
        return {"init": failed}
    steps = []
    for op, *args in trace["ops"]:
        method = {"allocate": "allocate", "append": "append_token", "fork": "fork", "free": "free"}[op]
        got = call(lambda name=method, given=args: getattr(manager, name)(*given))
        if op == "allocate" and not raised(got):
            got = None  # the lab compares what allocate did, not what it returned
        steps.append([got, *_state(manager)])
        if raised(got) and not got["memory"] and not trace.get("raises_ok"):
            break
    return {"steps": steps}


def traces(ns, args):
    cls = need(ns, "TinyBlockManager")
    return [_run(cls, trace) for trace in args["traces"]]


task2_allocate_append_tests = task2_fork_cow_tests = task2_free_tests = task2_random_tests = traces
