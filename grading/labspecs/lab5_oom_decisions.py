"""Lab 5 (out-of-memory decisions), scored in the grader's process.

Each graded cell gets failures drawn now, from seeds of the grading's own random draw: PyTorch 2.13 messages of
every kind (minialloc.learn.chapter7.random_evidence: live tensors, cached blocks, private pools, other processes,
non-PyTorch memory, a memory fraction, a container's own process), one line or wrapped as a log wraps them. The
student's read_oom reads the messages in the sandbox and decide decides on the grader's figures (so task 2 does
not hang on task 1); both are compared with chapter 7's references here. The probes are lab5_oom_decisions_probes.py.
"""

from __future__ import annotations

import random

from minialloc.learn import chapter7

from .probe_common import plain, shown

GRADED = ("task1_read_tests", "task1_wrapped_tests", "task2_kinds_tests", "task2_container_tests")
KINDS = (*chapter7.HOLDERS, "container")


def _messages(rng: random.Random, n: int, wrap: bool) -> list[str]:
    out = []
    for i in range(n):
        message = chapter7.random_evidence(rng, KINDS[i % len(KINDS)]).message()
        out.append(chapter7.wrapped(message, rng.choice([60, 72, 88, 100, 120])) if wrap else message)
    return out


def _as_data(fields: dict) -> dict:
    """read_oom's figures as JSON carries them: the pids' dict as [pid, bytes] pairs (JSON keys are text)."""
    return {**fields, "other_processes": sorted(fields["other_processes"].items())}


def inputs(grade_id: str, rng: random.Random) -> dict:
    if grade_id == "task1_read_tests":
        return {"messages": _messages(rng, 60, wrap=False)}
    if grade_id == "task1_wrapped_tests":
        return {"messages": _messages(rng, 40, wrap=True)}
    kinds = chapter7.HOLDERS if grade_id == "task2_kinds_tests" else ("container",)
    count = 90 if grade_id == "task2_kinds_tests" else 30
    fields = [chapter7.read_oom(chapter7.random_evidence(rng, kinds[i % len(kinds)]).message())
              for i in range(count)]
    return {"fields": [_as_data(f) for f in fields]}


def _canonical(value):
    """A probe's plain value with every dict's items in one order (a dict's order is not part of the answer)."""
    if isinstance(value, dict) and "!dict" in value:
        items = [[_canonical(k), _canonical(v)] for k, v in value["!dict"]]
        return {"!dict": sorted(items, key=repr)}
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def check(grade_id: str, args: dict, result) -> str | None:
    if grade_id.startswith("task1_"):
        for message, got in zip(args["messages"], result, strict=True):
            want = chapter7.read_oom(message)
            if _canonical(got) == _canonical(plain(want)):
                continue
            where = " ".join(message.split())[:160] + "..."
            if not (isinstance(got, dict) and "!dict" in got):
                return f"read_oom returned {shown(got)} for {where!r}"
            have = {repr(k): v for k, v in got["!dict"]}
            for key, value in want.items():
                mine = have.get(repr(key))
                if _canonical(mine) != _canonical(plain(value)):
                    return f"read_oom's {key} is {shown(mine)}, expected {value!r}, for {where!r}"
            return f"read_oom's keys are {sorted(have)}, expected {sorted(want)}"
        return None
    for fields, got in zip(args["fields"], result, strict=True):
        figures = {**fields, "other_processes": {int(p): int(b) for p, b in fields["other_processes"]}}
        want = chapter7.decide(figures)
        if got not in (plain(want), plain(list(want))):
            return f"decide returned {shown(got)} for {figures!r}; the holder is {want[0]!r}"
    return None
