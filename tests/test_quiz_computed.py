"""Computed questions: their answers are what minialloc computes, what the shown exhibit gives, and vary by seed."""

from __future__ import annotations

import ast
import contextlib
import io
import math
import re

import pytest

from minialloc import OutOfMemoryError
from minialloc.sizes import GiB, KiB, MiB
from quizzes import load_bank
from quizzes.computed import BLOCK_TOKENS, GENERATORS, IMPORTS, generate

SEEDS = range(12)


def _run(code: str) -> dict:
    namespace: dict = {}
    exec(compile(code, "<exhibit>", "exec"), namespace)  # the exhibit is code a student may copy and run
    return namespace


def _rounding(v):
    return _run(v.exhibit)["alloc"].memory_allocated()


def _reserved_mib(v):
    return _run(v.exhibit)["alloc"].memory_reserved() / MiB


def _oom(v):
    ns = _run(v.exhibit)  # the exhibit stops before the failing call: make it, as its last comment says
    with pytest.raises(OutOfMemoryError) as info:
        ns["alloc"].malloc(int(v.params["n"]))
    assert f"Tried to allocate {info.value.report.alloc_size / MiB:.2f} MiB" in str(info.value) or \
        info.value.report.alloc_size >= GiB
    return info.value.report.alloc_size / MiB


def _empty_cache(v):
    ns = _run(v.exhibit)
    before = ns["alloc"].memory_reserved()
    ns["alloc"].empty_cache()  # the call the question asks about, after the exhibit
    return (before - ns["alloc"].memory_reserved()) / MiB


_UNITS = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB}


def _summary(v):
    """Read the table as a student would: Cur Usage of reserved minus allocated."""
    def cur(label: str) -> int:
        m = re.search(rf"\| {label}\s*\|\s*(\d+) (B|KiB|MiB|GiB)", v.exhibit)
        assert m, label
        return int(m.group(1)) * _UNITS[m.group(2)]
    return (cur("GPU reserved memory") - cur("Allocated memory")) / MiB


def _size(text: str) -> float:
    number, unit = text.split()
    return float(number) * {"bytes": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB}[unit]


def _total_free(v):
    """Read the OOM message as a student would: device free plus reserved-but-unallocated."""
    free = re.search(r"of which ([\d.]+ \w+) is free", v.exhibit).group(1)
    cached = re.search(r"and ([\d.]+ \w+) is reserved by PyTorch but unallocated", v.exhibit).group(1)
    assert "largest free block" not in v.exhibit  # PyTorch's message has no such sentence
    return (_size(free) + _size(cached)) / GiB


def _fork(v):
    """The explanation's formula: full prompt blocks shared once, every sample's own blocks from there on."""
    prompt, samples, gen = (int(v.params[k]) for k in ("prompt", "samples", "generated"))
    full = prompt // BLOCK_TOKENS
    return full + samples * (math.ceil((prompt + gen) / BLOCK_TOKENS) - full)


def _prefix(v):
    system = int(v.params["system"])
    users = [int(u) for u in v.params["users"].split(", ")]
    return sum(math.ceil((system + u) / BLOCK_TOKENS) for u in users) - (len(users) - 1) * (system // BLOCK_TOKENS)


def _slots(v):
    return sum(math.ceil(int(n) / BLOCK_TOKENS) * BLOCK_TOKENS for n in v.params["lengths"].split(", "))


# How a reader gets each answer independently of the generator: running the exhibit, reading it, or the formula
# the explanation states. Each must agree with what the generator computed on minialloc.
INDEPENDENT = {
    "rounding_allocated": (_rounding, 0),
    "segment_reserved": (_reserved_mib, 0),
    "reserved_after_sequence": (_reserved_mib, 0),
    "oom_tried_to_allocate": (_oom, 0),
    "summary_reserved_unallocated": (_summary, 0.5),
    "empty_cache_released": (_empty_cache, 0),
    "fragmented_total_free": (_total_free, 0.02),
    "paged_fork_blocks": (_fork, 0),
    "paged_prefix_blocks": (_prefix, 0),
    "paged_slots": (_slots, 0),
}


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_no_code_exhibit_shows_its_answer(name):
    """Run as a notebook cell runs it, a code exhibit prints nothing, raises nothing, and its last line echoes no
    value (an expression there evaluates to None): the learner applies the rule, the cell does not hand it over."""
    for seed in SEEDS:
        v = generate(name, seed)
        if not v.exhibit.startswith(IMPORTS):
            continue  # a memory summary or an OOM message to read, not code
        tree = ast.parse(v.exhibit)
        *body, last = tree.body
        out, namespace = io.StringIO(), {}
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            exec(compile(ast.Module(body, []), "<exhibit>", "exec"), namespace)
            if isinstance(last, ast.Expr):  # what Jupyter would show under the cell
                echoed = eval(compile(ast.Expression(last.value), "<exhibit>", "eval"), namespace)
                assert echoed is None, (name, seed, ast.unparse(last), echoed)
            else:
                exec(compile(ast.Module([last], []), "<exhibit>", "exec"), namespace)
        assert out.getvalue() == "", (name, seed, out.getvalue())


def test_every_generator_is_checked():
    assert set(INDEPENDENT) == set(GENERATORS)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_answer_is_what_minialloc_computes(name):
    read, tolerance = INDEPENDENT[name]
    for seed in SEEDS:
        v = generate(name, seed)
        assert abs(read(v) - v.answer) <= tolerance + 1e-9, (name, seed, v.params)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_answers_vary_with_the_seed_and_repeat_for_the_same_seed(name):
    answers = [generate(name, f"student-{i}").answer for i in range(20)]
    assert len(set(answers)) >= 4, f"{name}: too few different answers to stop copying: {sorted(set(answers))}"
    again = generate(name, "student-3")
    assert again == generate(name, "student-3") and again.answer == answers[3]


def test_bank_tolerances_match_the_exhibits():
    """The bank's tolerance for each computed question covers the rounding of what the student reads."""
    for q in load_bank():
        if q.kind == "computed":
            assert q.tolerance >= INDEPENDENT[q.generator][1], q.id


def test_computed_text_shows_the_parameters():
    q = load_bank()["c2-computed-oom"]
    r = q.render("alice")
    v = generate("oom_tried_to_allocate", "c2-computed-oom|alice")
    assert v.params["n"] in r.text["en"] and v.params["n"] in r.text["vi"] and v.params["n"] in r.text["de"]
    assert r.answer == v.answer and r.exhibit == v.exhibit


def test_numbers_differ_between_seeds():
    """Practice sessions draw new numbers: a computed question is not one number to remember."""
    for q in load_bank():
        if q.kind == "computed":
            values = {q.render(f"s{i}").answer for i in range(12)}
            assert len(values) >= 4, q.id
            assert q.render("bob").answer == q.render("bob").answer  # the same seed, the same numbers
