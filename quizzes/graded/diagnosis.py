"""Diagnosis scenarios for the graded quiz: run minialloc, show what a user would see, record what it means.

Each scenario kind draws a situation from a random.Random (seeded from the course secret by quizzes.graded.pool),
runs it on minialloc and returns a Scenario: the exhibit a student reads (an OOM message worded as PyTorch words
it, a segment map, a snapshot excerpt), never code whose output is the answer, and the facts the situation has
(why it failed, what fixes it, what the allocator does next, how much it then holds). The private bank's
question text and options are the instructor's; an option says which fact it stands for with `means`.

This module is public and holds no answer: it can build every kind of situation, but which kind and which
numbers a graded question shows follow from the course secret. Reading it teaches how each situation arises,
which is the course's content; recognising it in an exhibit is what the questions ask.
"""

from __future__ import annotations

import json
import random
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, replace

from minialloc import CachingAllocator, OutOfMemoryError, SimulatedGPU
from minialloc.oom import OOMReport
from minialloc.sizes import MiB, format_size

DISTRACTOR = "distractor"  # an option's `means` when no situation makes it right


@dataclass(frozen=True)
class Scenario:
    exhibit: str  # shown under the question in a monospace block
    facts: dict[str, str | float]  # part id -> a word of the kind's vocabulary (choice) or a number
    params: dict[str, str]  # values for {placeholders} in the question's text


@dataclass(frozen=True)
class ScenarioKind:
    name: str
    parts: dict[str, tuple[str, ...] | None]  # part id -> the words its facts can take, or None for a number
    make: Callable[[random.Random], Scenario]


SCENARIOS: dict[str, ScenarioKind] = {}


def _register(name: str, parts: dict[str, tuple[str, ...] | None]) -> Callable[[Callable], Callable]:
    def wrap(fn: Callable[[random.Random], Scenario]) -> Callable[[random.Random], Scenario]:
        SCENARIOS[name] = ScenarioKind(name, parts, fn)
        return fn
    return wrap


def generate(kind: str, rng: random.Random) -> Scenario:
    try:
        return SCENARIOS[kind].make(rng)
    except KeyError:
        raise KeyError(f"no diagnosis scenario {kind!r}; known: {', '.join(sorted(SCENARIOS))}") from None


# -- the OOM message ------------------------------------------------------------------------------------------------

CAUSES = ("fragmentation", "capacity", "fraction", "other_process")
FIX_OF = {"fragmentation": "expandable_segments", "capacity": "smaller_batch", "fraction": "raise_fraction",
          "other_process": "free_other_process"}


def pytorch_message(report: OOMReport, other_process: int = 0) -> str:
    """The message as PyTorch prints it on a machine with NVML: minialloc's PyTorch wording (the
    expandable-segments hint included, as PyTorch prints it whether or not it applies), with the per-process
    lines NVML gives: this process's memory, and another process's when one holds memory on the GPU."""
    info = f"Including non-PyTorch memory, this process has {format_size(report.reserved)} memory in use. "
    if other_process:
        info = f"Process 4242 has {format_size(other_process)} memory in use. " + info
    text = "torch.OutOfMemoryError: " + replace(report, process_info=info).pytorch_message()
    return "\n".join(textwrap.wrap(text, 100, break_on_hyphens=False, break_long_words=False))


def _oom(alloc: CachingAllocator, nbytes: int) -> OOMReport | None:
    try:
        alloc.malloc(nbytes)
    except OutOfMemoryError as e:
        return e.report
    return None


def _fragmentation(rng: random.Random) -> OOMReport | None:
    cap = rng.choice((2, 4, 8)) * 1024
    seg = rng.randrange(200, 600, 2)
    count = rng.randint(3, min(8, (cap - 100) // seg))
    keep = rng.randint(seg // 2 + 2, seg - 60)  # more than half: each kept tensor stays alone in its segment
    alloc = CachingAllocator(SimulatedGPU(f"{cap}MiB"), "")
    filler = cap - count * seg - rng.randrange(20, 90, 2)  # most of the device is held by live tensors
    if filler > 0:
        alloc.malloc(filler * MiB)
    big = [alloc.malloc(seg * MiB) for _ in range(count)]
    for p in big:
        alloc.free(p)
    for _ in range(count):
        alloc.malloc(keep * MiB)
    free_mib = alloc.device.mem_get_info()[0] // MiB
    largest = max(seg - keep, free_mib)
    total = free_mib + count * (seg - keep)
    if total - largest < 40:
        return None
    report = _oom(alloc, rng.randint(largest + 10, total - 10) * MiB)
    if report is None or not report.total_free >= report.alloc_size > report.largest_free_block:
        return None
    return report


def _capacity(rng: random.Random) -> OOMReport | None:
    cap = rng.choice((2, 4, 8)) * 1024
    alloc = CachingAllocator(SimulatedGPU(f"{cap}MiB"), "")
    ptrs = []
    while alloc.device.mem_get_info()[0] > 600 * MiB:
        ptrs.append(alloc.malloc(rng.randrange(100, 500, 2) * MiB))
    if rng.random() < 0.6:  # a small freed hole: some reserved-but-unallocated memory that is far too little
        alloc.free(ptrs.pop(rng.randrange(len(ptrs))))
        alloc.malloc(rng.randrange(60, 90, 2) * MiB)
    free = alloc.device.mem_get_info()[0] + alloc.memory_reserved() - alloc.memory_allocated()
    report = _oom(alloc, free + rng.randrange(200, 1200, 2) * MiB)
    if report is None or report.total_free >= report.alloc_size:
        return None
    return report


def _fraction(rng: random.Random) -> OOMReport | None:
    cap = rng.choice((8, 16, 24)) * 1024
    fraction = rng.choice((0.25, 0.3, 0.4, 0.5))
    alloc = CachingAllocator(SimulatedGPU(f"{cap}MiB"), "")
    alloc.set_per_process_memory_fraction(fraction)
    allowed = int(cap * fraction) * MiB
    while allowed - alloc.memory_reserved() > 700 * MiB:
        alloc.malloc(rng.randrange(100, 600, 2) * MiB)
    report = _oom(alloc, (allowed - alloc.memory_reserved()) + rng.randrange(100, 1500, 2) * MiB)
    if report is None or report.allowed is None or report.device_free < report.alloc_size:
        return None
    return report


def _other_process(rng: random.Random) -> OOMReport | None:
    cap = rng.choice((8, 16, 24)) * 1024
    gpu = SimulatedGPU(f"{cap}MiB")
    gpu.malloc(int(cap * rng.uniform(0.7, 0.9)) // 2 * 2 * MiB)  # another process's memory, taken from the device
    alloc = CachingAllocator(gpu, "")
    try:
        for _ in range(rng.randint(1, 4)):
            alloc.malloc(rng.randrange(50, 400, 2) * MiB)
    except OutOfMemoryError:  # the other process left less than these tensors: not the clean case, draw again
        return None
    report = _oom(alloc, gpu.mem_get_info()[0] + rng.randrange(100, 1500, 2) * MiB)
    if report is None or report.total_free >= report.alloc_size or report.reserved > 0.5 * cap * MiB:
        return None
    return report


_MAKERS: dict[str, Callable[[random.Random], OOMReport | None]] = {
    "fragmentation": _fragmentation, "capacity": _capacity, "fraction": _fraction, "other_process": _other_process}


@_register("oom_message", {"cause": CAUSES, "fix": tuple(FIX_OF.values())})
def oom_message(rng: random.Random) -> Scenario:
    """A training step dies with this message: why, and which change lets it run."""
    cause = rng.choice(CAUSES)
    for _ in range(200):  # each maker rejects the draws that do not show its cause cleanly
        report = _MAKERS[cause](rng)
        if report is not None:
            break
    else:  # the makers' ranges make this unreachable; fail loudly rather than publish a wrong question
        raise AssertionError(f"oom_message: no {cause} scenario found")
    # the device memory neither free nor this process's is the other process's
    other = report.total_capacity - report.device_free - report.reserved if cause == "other_process" else 0
    return Scenario(pytorch_message(report, other_process=other),
                    {"cause": cause, "fix": FIX_OF[cause]}, {})


# -- the segment map and the snapshot excerpt ----------------------------------------------------------------------

OUTCOMES = ("cached_block", "new_segment", "release_then_new", "oom")


@dataclass(frozen=True)
class _State:
    tensors: tuple[tuple[int, int], ...]  # (MiB, stream) in malloc order
    freed: tuple[int, ...]  # indices freed, in order
    extra_mib: int  # device memory left free after the segments


def _replay(state: _State) -> CachingAllocator:
    probe = CachingAllocator(SimulatedGPU("64GiB"), "")
    _apply(probe, state)
    capacity = probe.memory_reserved() // MiB + state.extra_mib
    alloc = CachingAllocator(SimulatedGPU(f"{capacity}MiB"), "")
    _apply(alloc, state)
    return alloc


def _apply(alloc: CachingAllocator, state: _State) -> None:
    ptrs = [alloc.malloc(mib * MiB, stream=stream) for mib, stream in state.tensors]
    for i in state.freed:
        alloc.free(ptrs[i])


def _outcome(state: _State, request_mib: int) -> tuple[str, float]:
    """What malloc(request) on stream 0 does to this state, read off minialloc's counters; and reserved after."""
    alloc = _replay(state)
    before = alloc.memory_stats()
    try:
        alloc.malloc(request_mib * MiB, stream=0)
    except OutOfMemoryError:
        outcome = "oom"
    else:
        after = alloc.memory_stats()
        if after["num_alloc_retries"] > before["num_alloc_retries"]:
            outcome = "release_then_new"
        elif after["num_device_alloc"] > before["num_device_alloc"]:
            outcome = "new_segment"
        else:
            outcome = "cached_block"
    return outcome, alloc.memory_reserved() / MiB


def _draw_state(rng: random.Random) -> _State:
    tensors = []
    for _ in range(rng.randint(5, 9)):
        mib = rng.randint(2, 9) if rng.random() < 0.55 else rng.randint(12, 70)
        tensors.append((mib, 1 if rng.random() < 0.2 else 0))
    freed = tuple(sorted(rng.sample(range(len(tensors)), rng.randint(2, len(tensors) - 2))))
    extra = rng.choice((0, rng.randrange(2, 24, 2), rng.randrange(24, 80, 2)))
    return _State(tuple(tensors), freed, extra)


def _find_case(rng: random.Random) -> tuple[_State, int, str, float]:
    target = rng.choice(OUTCOMES)
    for _ in range(300):
        state = _draw_state(rng)
        alloc = _replay(state)
        holes = [b["size"] // MiB for s in alloc.snapshot()["segments"] for b in s["blocks"]
                 if b["state"] == "inactive"]
        candidates = {rng.randint(2, 120) for _ in range(6)} | {h + d for h in holes for d in (-1, 0, 1)}
        for request in sorted(c for c in candidates if c >= 2):
            outcome, reserved_after = _outcome(state, request)
            if outcome == target:
                return state, request, outcome, reserved_after
    raise AssertionError(f"segment scenario: no case for {target}")  # unreachable with the ranges above


def _segments(alloc: CachingAllocator) -> list[dict]:
    return sorted(alloc.snapshot()["segments"], key=lambda s: s["address"])


def _map_text(alloc: CachingAllocator) -> str:
    free, total = alloc.device.mem_get_info()
    lines = [f"GPU 0: {format_size(total)} in total, {format_size(free)} free on the device; "
             "PYTORCH_CUDA_ALLOC_CONF is empty (no expandable segments)",
             "segment  pool   stream  size        blocks, in address order"]
    for label, seg in zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", _segments(alloc), strict=False):
        blocks = " | ".join(f"{format_size(b['size'])} {'in use' if b['state'] == 'active_allocated' else 'free'}"
                            for b in seg["blocks"])
        lines.append(f"{label:<8} {seg['segment_type']:<6} {seg['stream']:<7} {format_size(seg['total_size']):<11} "
                     f"| {blocks} |")
    return "\n".join(lines)


def _snapshot_text(alloc: CachingAllocator) -> str:
    free, total = alloc.device.mem_get_info()
    segments = [{"address": hex(s["address"]), "total_size": s["total_size"], "stream": s["stream"],
                 "segment_type": s["segment_type"],
                 "blocks": [{"size": b["size"], "state": b["state"]} for b in s["blocks"]]}
                for s in _segments(alloc)]
    head = (f"# torch.cuda.mem_get_info() -> ({free}, {total})   (free, total bytes)\n"
            "# torch.cuda.memory._snapshot()['segments'], trimmed to the fields that matter here\n")
    return head + "[\n" + ",\n".join(" " + json.dumps(s) for s in segments) + "\n]"


def _segment_scenario(rng: random.Random, style: str) -> Scenario:
    state, request, outcome, reserved_after = _find_case(rng)
    alloc = _replay(state)
    exhibit = _map_text(alloc) if style == "map" else _snapshot_text(alloc)
    return Scenario(exhibit, {"outcome": outcome, "reserved_after": reserved_after},
                    {"request": str(request), "request_bytes": str(request * MiB)})


_SEGMENT_PARTS: dict[str, tuple[str, ...] | None] = {"outcome": OUTCOMES, "reserved_after": None}


@_register("segment_map", _SEGMENT_PARTS)
def segment_map(rng: random.Random) -> Scenario:
    """A segment map, then one more request on stream 0: what does the allocator do, and what does it hold then?"""
    return _segment_scenario(rng, "map")


@_register("snapshot_excerpt", _SEGMENT_PARTS)
def snapshot_excerpt(rng: random.Random) -> Scenario:
    """The same question, read from the segments of a memory snapshot (sizes in bytes, states as PyTorch names)."""
    return _segment_scenario(rng, "snapshot")
