"""The what-if's range for a trace that starts mid-run (minialloc.bounds): on every cut of the project's from-start
traces, each setting's true peak reserved from the cut on (the whole run replayed under it) lies inside the range
the cut file gives, the estimate lies inside it too, and the verdict follows from the range."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from minialloc import CachingAllocator, SimulatedGPU
from minialloc.bounds import CANNOT_TELL, NOT_SAVED, SAVED, PeakRange, peak_range
from minialloc.replay import replay_ops, replay_trace
from minialloc.trace import read_device_trace, read_snapshot
from minialloc.workloads import canonical_scenario, inference_batches, training_steps

SLIME = Path(__file__).parent / "fixtures" / "real_snapshots" / "slime-init-model-private-pool.pickle"
CONFIGS = ("expandable_segments:True", "max_split_size_mb:256", "")
CUTS = (0.1, 0.25, 0.5, 0.75, 0.9)


@cache
def source(name: str) -> tuple[dict, int]:
    """A run traced from its first allocation: minialloc's workloads recorded natively, or the real slime file."""
    if name == "slime":
        return read_snapshot(SLIME), 3
    events = {"training": lambda: training_steps(steps=3), "inference": lambda: inference_batches(requests=80),
              "canonical": canonical_scenario}[name]()
    a = CachingAllocator(SimulatedGPU("200GiB"), "")
    a.record_memory_history()
    replay_ops(events, a)
    return a.snapshot(), 0


def truth_from(name: str, config: str, at: int) -> int:
    """The whole run replayed under config: its largest reserved bytes at the cut or after it."""
    snap, device = source(name)
    full = read_device_trace(snap, device, name)
    whole, _ = replay_trace(full, config, keep_samples=True)
    before = [k for k, op in enumerate(full.ops) if op[1] < at]
    start = whole.samples[before[-1]][1] if before else 0
    return max([start] + [whole.samples[k][1] for k, op in enumerate(full.ops) if op[1] >= at])


def cut_trace(name: str, share: float):
    snap, device = source(name)
    traces = [list(t) for t in snap["device_traces"]]
    at = int(len(traces[device]) * share)
    traces[device] = traces[device][at:]
    return read_device_trace(dict(snap, device_traces=traces), device, name), at


@pytest.mark.parametrize("name", ["training", "inference", "canonical", "slime"])
def test_the_truth_lies_inside_the_range_on_every_cut(name):
    for share in CUTS:
        part, at = cut_trace(name, share)
        assert part.reserved_at_start > 0  # a mid-run file: the run held memory at its first entry
        for config in CONFIGS:
            r = peak_range(part, config, "")
            truth = truth_from(name, config, at)
            assert r.low <= truth <= r.high, (name, share, config, r, truth)
            assert r.low <= r.estimate <= r.high
            if config == "":  # the recorded settings: the as-recorded replay is exact
                assert r.exact and r.low == r.high == truth


def test_the_verdict_follows_from_the_range():
    r = PeakRange("expandable_segments:True", low=100, estimate=120, high=150)
    assert r.verdict(150) == SAVED and r.verdict(99) == NOT_SAVED and r.verdict(120) == CANNOT_TELL
    assert r.width == 0.5
