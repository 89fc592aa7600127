"""Computed questions: their answers are what minialloc computes, what the scenario rebuilt from the question's
numbers or the exhibit read by hand gives; no exhibit is code; every wrong rule gives another number; answers vary
by seed."""

from __future__ import annotations

import math
import re

import pytest

from minialloc import CachingAllocator, OutOfMemoryError, SimulatedGPU
from minialloc.sizes import GiB, KiB, MiB
from quizzes import load_bank
from quizzes.computed import BLOCK_TOKENS, GENERATORS, distinct, generate

SEEDS = range(12)


def _fresh(capacity: str = "8GiB") -> CachingAllocator:
    return CachingAllocator(SimulatedGPU(capacity), "")


# Each reader rebuilds the scenario from the parameters the question shows, as a learner would set it up in
# minialloc, or reads the exhibit (a summary, an OOM message): an answer independent of the generator's own run.

def _rounding(v):
    alloc = _fresh()
    x = alloc.malloc(int(v.params["first"]))
    alloc.malloc(int(v.params["n"]))
    alloc.free(x)
    return alloc.memory_allocated()


def _segment(v):
    alloc = _fresh()
    alloc.free(alloc.malloc(int(v.params["n"])))
    return alloc.memory_reserved() / MiB


def _sequence(v):
    alloc = _fresh()
    for size in v.params["sizes"].split(", "):
        alloc.malloc(int(size) * MiB)
    return alloc.memory_reserved() / MiB


def _best_fit(v):
    """The rule by hand: the smallest listed block of at least the request."""
    request = int(v.params["request"])
    return min(b for b in map(int, v.params["blocks"].split(", ")) if b >= request)


def _oom(v):
    alloc = _fresh(f"{v.params['capacity']}GiB")
    alloc.malloc(int(v.params["weights"]) * MiB)
    with pytest.raises(OutOfMemoryError) as info:
        alloc.malloc(int(v.params["n"]))
    assert f"Tried to allocate {info.value.report.alloc_size / MiB:.2f} MiB" in str(info.value) or \
        info.value.report.alloc_size >= GiB
    return info.value.report.alloc_size / MiB


def _empty_cache(v):
    alloc = _fresh()
    ptrs = {}
    for item in v.params["tensors"].split(", "):  # "m0 (4 MiB)"
        name, size = item.split(" (")
        ptrs[name] = alloc.malloc(int(size.removesuffix(" MiB)")) * MiB)
    for name in v.params["freed"].split(", "):
        alloc.free(ptrs[name])
    before = alloc.memory_reserved()
    alloc.empty_cache()  # the call the question asks about
    return (before - alloc.memory_reserved()) / MiB


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
    "segment_reserved": (_segment, 0),
    "reserved_after_sequence": (_sequence, 0),
    "best_fit_block": (_best_fit, 0),
    "oom_tried_to_allocate": (_oom, 0),
    "summary_reserved_unallocated": (_summary, 0.5),
    "empty_cache_released": (_empty_cache, 0),
    "fragmented_total_free": (_total_free, 0.02),
    "paged_fork_blocks": (_fork, 0),
    "paged_prefix_blocks": (_prefix, 0),
    "paged_slots": (_slots, 0),
}


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_no_exhibit_is_code(name):
    """A code exhibit is one print() away from its answer: the scenario is told in words, and an exhibit is only
    something to read (a memory summary, an OOM message in PyTorch's words)."""
    for seed in SEEDS:
        exhibit = generate(name, seed).exhibit
        assert "alloc.malloc" not in exhibit and "import" not in exhibit, (name, seed)
        if exhibit:
            assert exhibit.startswith(("|", "=", "CUDA out of memory")), (name, seed, exhibit[:80])


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_every_wrong_rule_gives_another_number(name):
    """The numbers are drawn so that each misconception the generator names gives its own answer, different from
    the right one: a right answer is evidence of the rule, not of a lucky coincidence (1000 bytes rounds to 1024
    by the 512-byte rule and by the power-of-two guess alike)."""
    for seed in range(60):
        v = generate(name, seed)
        assert v.wrong and distinct(v.answer, v.wrong, gap=0.004), (name, seed, v.answer, v.wrong)


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
