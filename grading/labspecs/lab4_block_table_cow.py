"""Lab 4 (block tables, reference counts, copy-on-write), scored in the grader's process.

Every operation of a trace runs on the student's TinyBlockManager in the sandbox, which returns the state the
lab's side_by_side compares (tables, token counts, reference counts, the free queue) after each one; here the same
trace runs on minialloc's BlockManager. The traces are the lab's visible and hidden ones, and random ones whose
seeds are drawn at grading time. (The lab's hidden KV read-back check follows from agreeing with BlockManager at
every step.) The probes are lab4_block_table_cow_probes.py.
"""

from __future__ import annotations

import random

from minialloc.paging import BlockManager

from .probe_common import plain, raised, shown

GRADED = ("task1_addressing_tests", "task2_allocate_append_tests", "task2_fork_cow_tests", "task2_free_tests",
          "task2_random_tests")
NAMES = ("returned", "tables", "num_tokens", "ref_cnt", "free_queue")


def random_ops(seed: int, n: int = 200, max_prompt: int = 10) -> list[list]:
    """The lab's random_ops: n random operations on live sequences."""
    rng = random.Random(seed)
    live: list[int] = []
    next_id = 0
    ops: list[list] = []
    for _ in range(n):
        r = rng.random()
        if not live or r < 0.15:
            ops.append(["allocate", next_id, rng.randint(0, max_prompt)])
            live.append(next_id)
            next_id += 1
        elif r < 0.65:
            ops.append(["append", rng.choice(live)])
        elif r < 0.8:
            ops.append(["fork", rng.choice(live), next_id])
            live.append(next_id)
            next_id += 1
        else:
            ops.append(["free", live.pop(rng.randrange(len(live)))])
    return ops


def kept_ops(seed: int, n: int, num_blocks: int, block_size: int) -> list[list]:
    """The lab's run_random: random_ops without the operations on sequences that failed to allocate or were freed."""
    probe = BlockManager(num_blocks, block_size, False)
    kept = []
    for op, *args in random_ops(seed, n):
        if op != "allocate" and args[0] not in probe.seqs:
            continue
        try:
            if op == "allocate":
                probe.allocate(args[0], [0] * args[1])
            elif op == "append":
                probe.append_token(args[0], 0)
            else:
                getattr(probe, op)(*args)
        except MemoryError:
            pass
        kept.append([op, *args])
    return kept


def trace(ops, num_blocks: int = 12, block_size: int = 4, raises_ok: bool = False) -> dict:
    return {"ops": [list(op) for op in ops], "num_blocks": num_blocks, "block_size": block_size,
            "raises_ok": raises_ok}


def inputs(grade_id: str, rng: random.Random) -> dict:
    if grade_id == "task1_addressing_tests":
        needed = [[7, 16], [0, 16], [1, 16], [16, 16], [17, 16], [32, 16], [33, 16]]
        slots = [[[7, 2, 9], 0, 4], [[7, 2, 9], 5, 4], [[7, 2, 9], 11, 4], [[7, 2, 9], 4, 4]]
        table = [7, 2, 9, 0, 5, 11]
        for bs in (1, 2, 3, 4, 16, 32):
            needed += [[n, bs] for k in range(6) for n in (k * bs - 1, k * bs, k * bs + 1) if n >= 0]
            slots += [[table, pos, bs] for pos in sorted({k * bs + d for k in range(6) for d in (-1, 0, 1)}
                                                         & set(range(6 * bs)))]
        for _ in range(2000):
            bs, n = rng.choice([1, 2, 4, 16, 32]), rng.randint(0, 200)
            needed.append([n, bs])
            rows = rng.sample(range(1000), max(1, -(-n // bs)))
            slots.append([rows, rng.randrange(0, len(rows) * bs), bs])
        return {"blocks_needed": needed, "slot_of": slots}
    if grade_id == "task2_allocate_append_tests":
        ops = [["allocate", 0, 0], ["append", 0]] + [["append", 0]] * 9 + [["allocate", 1, 13], ["append", 1]]
        ops += [["allocate", 2, 30], ["allocate", 3, 1]] + [["append", 3]] * 4
        traces = [trace([["allocate", 0, 6], ["allocate", 1, 4], ["append", 0], ["append", 0], ["append", 0],
                         ["allocate", 2, 17]], 8, 4),
                  trace([["allocate", 0, 6], ["allocate", 1, 4], ["append", 0], ["append", 1], ["append", 0]]),
                  trace(ops, 8, 4),
                  trace([["allocate", 0, 8], ["allocate", 1, 7], ["allocate", 2, 9], ["append", 1], ["append", 1],
                         ["append", 0], ["allocate", 3, 4], ["allocate", 4, 1]], 8, 4),
                  trace([["allocate", 0, 31], ["append", 0], ["append", 0], ["allocate", 1, 0], ["append", 1]], 8, 4),
                  trace([["allocate", 0, 6], ["allocate", 0, 1]], 8, 4, raises_ok=True)]  # an existing sequence
    elif grade_id == "task2_fork_cow_tests":
        traces = [trace([["allocate", 0, 6], ["fork", 0, 1], ["append", 1], ["append", 0], ["append", 0],
                         ["fork", 0, 2], ["append", 2], ["append", 2]], 8, 4),
                  trace([["allocate", 0, 3], ["fork", 0, 1], ["fork", 0, 2], ["fork", 1, 3], ["append", 3],
                         ["append", 2], ["append", 1], ["append", 0], ["append", 0], ["append", 3]], 6, 4),
                  trace([["allocate", 0, 3], ["allocate", 1, 4], ["fork", 0, 2], ["append", 2], ["append", 0]], 2, 4)]
    elif grade_id == "task2_free_tests":
        traces = [trace([["allocate", 0, 12], ["fork", 0, 1], ["free", 0], ["free", 1], ["allocate", 2, 5]], 6, 4),
                  trace([["allocate", 0, 5], ["allocate", 1, 5], ["free", 0], ["allocate", 2, 9], ["fork", 2, 3],
                         ["free", 2], ["append", 3], ["free", 3], ["allocate", 4, 24]], 12, 4)]
    elif grade_id == "task2_random_tests":
        traces = [trace(kept_ops(0, 200, 12, 4))]  # the visible test: run_random(seed=0)
        for _ in range(12):
            seed = rng.randrange(1 << 30)
            blocks, size = rng.choice([6, 12, 30]), rng.choice([1, 2, 4, 16])
            traces.append(trace(kept_ops(seed, 250, blocks, size), blocks, size))
    else:
        raise KeyError(f"lab4_block_table_cow has no graded test cell {grade_id!r}")
    return {"traces": traces}



def check(grade_id: str, args: dict, result) -> str | None:
    if grade_id == "task1_addressing_tests":
        for (n, bs), got in zip(args["blocks_needed"], result["blocks_needed"], strict=True):
            if got != len(range(0, n, bs)):
                return f"blocks_needed({n}, {bs}) returned {shown(got)}, expected {len(range(0, n, bs))}"
        for (table, pos, bs), got in zip(args["slot_of"], result["slot_of"], strict=True):
            want = table[pos // bs] * bs + pos % bs
            if got != want:
                return f"slot_of({table}, {pos}, {bs}) returned {shown(got)}, expected {want}"
        return None
    for number, (spec, got) in enumerate(zip(args["traces"], result, strict=True)):
        problem = compare(spec, got)
        if problem:
            return f"trace {number + 1} of {len(args['traces'])}: {problem}"
    return None


def reference(spec: dict) -> list[list]:
    ref = BlockManager(spec["num_blocks"], spec["block_size"], False)
    steps = []
    for op, *args in spec["ops"]:
        try:
            if op == "allocate":
                ref.allocate(args[0], list(range(args[1])))
                out = None
            elif op == "append":
                out = plain(ref.append_token(args[0], 0))
            elif op == "fork":
                out = plain(ref.fork(*args))
            else:
                out = plain(ref.free(*args))
        except (MemoryError, ValueError) as error:
            out = {"!raised": type(error).__name__, "memory": isinstance(error, MemoryError),
                   "value": isinstance(error, ValueError)}
        steps.append([out, plain({s: list(st.table) for s, st in ref.seqs.items()}),
                      plain({s: len(st.tokens) for s, st in ref.seqs.items()}),
                      plain([b.ref_cnt for b in ref.blocks]), plain([b.block_id for b in ref.free_queue])])
    return steps


def compare(spec: dict, got) -> str | None:
    if not isinstance(got, dict) or not isinstance(got.get("steps", got.get("init")), (list, dict)):
        return "no observation came back"
    if "init" in got:
        return f"TinyBlockManager({spec['num_blocks']}, {spec['block_size']}) {shown(got['init'])}"
    for step, (op, want) in enumerate(zip(spec["ops"], reference(spec), strict=True)):
        if step >= len(got["steps"]):
            return f"step {step} {tuple(op)} was not reached"
        seen = got["steps"][step]
        if not isinstance(seen, list) or len(seen) != len(want):
            return f"step {step}: the observation is incomplete"
        for name, g, w in zip(NAMES, seen, want, strict=True):
            if raised(w) and raised(g) and (g["memory"] == w["memory"] and g["value"] == w["value"]):
                continue  # the same kind of refusal on both sides
            if g != w:
                what = "returned" if name == "returned" else name
                return f"step {step} {tuple(op)}: {what} {shown(g)}, BlockManager {shown(w)}"
    return None
