"""Replaying the snapshots users actually have: traces that start mid-run, several devices, expandable segments,
OOMs. The real PyTorch snapshots are in tests/fixtures/real_snapshots (see its README for their sources): five that
replay address-exact, and three of other kinds users have (PyTorch 2.0's format, a private pool, no trace)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from minialloc import CachingAllocator, MiB, SimulatedGPU
from minialloc.cli import main
from minialloc.oom import OutOfMemoryError
from minialloc.replay import check_trace, replay_trace, what_if_trace
from minialloc.trace import (
    TraceError,
    read_device_trace,
    read_snapshot,
    recorded_config,
    state_at_trace_start,
)

REAL = Path(__file__).parent / "fixtures" / "real_snapshots"
ALL = sorted(REAL.glob("*.pickle"))
# the ones whose every allocation replays at its recorded address
FILES = [REAL / f"{name}.pickle" for name in (
    "bolongcheng-xl-fwd-cl512-bf16-expandable", "hyperion-large-cl256-fw-with-grad-bf16", "magma27-assignment2-systems",
    "wedsonlin-medium1024-inference", "wedsonlin-medium128-training", "slime-init-model-private-pool")]
SINGLE_DEVICE = FILES[:5]  # device 0 traced, from mid-run
FLEXGEN = REAL / "flexgen-opt1.3b-torch20.pickle"
NO_TRACE = REAL / "zijiandu-attention-no-trace.pickle"


def test_every_real_snapshot_is_here_with_its_license():
    assert len(ALL) == 8 and set(FILES) <= set(ALL) and {FLEXGEN, NO_TRACE} <= set(ALL)
    assert "Copyright 2025 Stanford University" in (REAL / "LICENSE").read_text()
    assert "Apache License" in (REAL / "LICENSE-APACHE-2.0").read_text()
    readme = (REAL / "README.md").read_text()
    assert all(f.name in readme for f in ALL)
    assert "Copyright 2023 - The FlexGen team" in readme


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_replay_from_the_rebuilt_state_lands_every_allocation_at_its_recorded_address(path):
    snap = read_snapshot(path)
    (device,) = [d for d, t in enumerate(snap["device_traces"]) if t]  # the slime run traced device 3
    trace = read_device_trace(snap, device, str(path))
    config = recorded_config(snap)
    check = check_trace(trace, config)
    assert check.allocations == sum(e["action"] == "alloc" for e in snap["device_traces"][device])
    assert check.at_recorded_address == check.allocations, check.summary()
    # the as-recorded row's peak reserved is the recorded run's, computed from the snapshot alone
    result, alloc = replay_trace(trace, config, at_recorded=True)
    assert result.peak_reserved == trace.recorded_peak_reserved
    assert result.ooms == 0
    # and the replay ends in the snapshot's own final state, block for block
    final = [(s["address"], s["total_size"], tuple(s.get("segment_pool_id", (0, 0))),
              [(b["address"], b["size"], b["state"]) for b in s["blocks"]]) for s in snap["segments"]]
    replayed = [(s["address"], s["total_size"], s["segment_pool_id"],
                 [(b["address"], b["size"], b["state"]) for b in s["blocks"]]) for s in alloc.snapshot()["segments"]]
    assert replayed == final
    alloc.check_invariants()


def test_state_at_trace_start_is_public_and_in_the_snapshot_schema():
    path = REAL / "hyperion-large-cl256-fw-with-grad-bf16.pickle"
    snap = read_snapshot(path)
    segments = state_at_trace_start(snap, 0)
    # 177 segments were allocated during the trace, none freed
    assert len(segments) == len(snap["segments"]) - 177
    for seg in segments:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert {"address", "total_size", "stream", "segment_type", "is_expandable", "blocks"} <= set(seg)
    # its first allocation lands 640 KiB into a gap after a block freed later: that block had a 640 KiB tail
    first = next(e for e in snap["device_traces"][0] if e["action"] == "alloc")
    seg = next(s for s in segments if s["address"] <= first["addr"] < s["address"] + s["total_size"])
    free = next(b for b in seg["blocks"] if b["address"] == first["addr"])
    assert free["state"] == "inactive"


def test_a_corrupt_or_contradictory_snapshot_gets_one_line_naming_the_problem(tmp_path, capsys):
    snap = read_snapshot(REAL / "magma27-assignment2-systems.pickle")
    cut = dict(snap, segments=snap["segments"][5:])  # the final state lost segments the trace uses
    with pytest.raises(TraceError, match=r"trace entry \d+"):
        read_device_trace(cut, 0, "cut.pickle")
    path = tmp_path / "cut.pickle"
    path.write_bytes(pickle.dumps(cut))
    assert main(["replay", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cut.pickle" in err and "trace entry" in err
    broken = tmp_path / "broken.pickle"
    broken.write_bytes((REAL / "magma27-assignment2-systems.pickle").read_bytes()[:5000])
    assert main(["diagnose", str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "broken.pickle" in err
    untraced = tmp_path / "untraced.pickle"  # segments, but history was never switched on
    untraced.write_bytes(pickle.dumps(dict(snap, device_traces=[])))
    assert main(["replay", str(untraced)]) == 2
    err = capsys.readouterr().err
    assert "no trace for device 0" in err and "torch.cuda.memory._record_memory_history(" in err


def test_cli_check_and_replay_on_a_real_file(capsys):
    path = str(REAL / "wedsonlin-medium1024-inference.pickle")
    assert main(["replay", path, "--check"]) == 0
    assert "1280 of 1280 allocations at the recorded address" in capsys.readouterr().out
    assert main(["replay", path, "--json", "--no-fit"]) == 0
    out = json.loads(capsys.readouterr().out)
    (dev,) = out["devices"]
    assert dev["capacity"] is None and dev["results"][0]["label"] == "as recorded (native)"
    assert dev["results"][0]["peak_reserved"] == dev["recorded_peak_reserved"]
    hyperion = str(REAL / "hyperion-large-cl256-fw-with-grad-bf16.pickle")
    assert main(["replay", hyperion, "--from-empty", "--no-fit"]) == 0
    text = capsys.readouterr().out
    assert "from an empty GPU" in text
    assert "frees of blocks allocated before the trace began were skipped" in text


# -- minialloc runs written as PyTorch writes them ---------------------------------------------------------------
def as_pytorch(snapshots: list[dict]) -> dict:
    """Several devices' minialloc snapshots as one PyTorch snapshot: segments carry "device", device_traces has a
    list per device, entries keep PyTorch's keys only (no minialloc marks), oom entries carry device_free."""
    segments, traces = [], []
    for d, snap in enumerate(snapshots):
        for seg in snap["segments"]:
            segments.append(dict(seg, device=d))
        entries = []
        for e in snap["device_traces"][0]:
            if e["action"] == "snapshot":
                continue
            out = {"action": e["action"], "size": e["size"], "stream": e["stream"], "time_us": e["time_us"],
                   "compile_context": "N/A", "user_metadata": ""}
            key = "device_free" if e["action"] == "oom" else "addr"
            out[key] = e[key]
            if e.get("frames"):
                out["frames"] = e["frames"]
            entries.append(out)
        traces.append(entries)
    return {"segments": segments, "device_traces": traces, "allocator_settings": snapshots[0]["allocator_settings"],
            "external_annotations": []}


def run(alloc: CachingAllocator, steps: list[tuple], live: dict) -> None:
    """('a', name, size) mallocs, ('f', name) frees, ('e',) empty_cache; a malloc that OOMs is skipped."""
    for step in steps:
        if step[0] == "a":
            try:
                live[step[1]] = alloc.malloc(step[2])
            except OutOfMemoryError:
                pass
        elif step[0] == "f":
            if step[1] in live:
                alloc.free(live.pop(step[1]))
        else:
            alloc.empty_cache()


def training(n: int, seed: int, scale: int = 1) -> list[tuple]:
    """A small training-like mix: weights kept, activations freed in reverse, a few empty_cache calls."""
    import random

    rng = random.Random(seed)
    steps: list[tuple] = [("a", f"w{k}", rng.choice([1, 3, 24, 100]) * MiB * scale) for k in range(6)]
    for s in range(n):
        acts = [f"s{s}a{k}" for k in range(8)]
        steps += [("a", name, rng.choice([4096, 300_000, 2 * MiB, 11 * MiB, 40 * MiB]) * scale) for name in acts]
        steps += [("f", name) for name in reversed(acts[2:])]
        steps += [("a", f"s{s}g", 5 * MiB * scale), ("f", f"s{s}g")] + [("f", name) for name in acts[:2]]
        if s % 5 == 4:
            steps.append(("e",))
    return steps


@pytest.mark.parametrize("config", ["", "expandable_segments:True", "max_split_size_mb:64"])
@pytest.mark.parametrize("how", ["switched on late", "ring buffer"])
def test_a_recording_started_mid_run_replays_to_the_live_run_figures(config, how):
    steps = training(40, seed=7)
    live_alloc = CachingAllocator(SimulatedGPU("4GiB"), config)
    live: dict = {}
    if how == "switched on late":
        run(live_alloc, steps[: len(steps) // 2], live)
        live_alloc.record_memory_history()
        live_alloc.reset_peak_memory_stats()
        run(live_alloc, steps[len(steps) // 2:], live)
    else:
        live_alloc.record_memory_history(max_entries=300)
        run(live_alloc, steps, live)
    snap = as_pytorch([live_alloc.snapshot()])
    trace = read_device_trace(snap, 0)
    assert recorded_config(snap) == config
    check = check_trace(trace, config)
    assert check.ok and check.allocations > 50, check.summary()
    result, replayed = replay_trace(trace, config, at_recorded=True)
    assert result.peak_reserved == trace.recorded_peak_reserved
    if how == "switched on late":  # the live run's peaks since recording began
        assert result.peak_reserved == live_alloc.max_memory_reserved()
        assert result.peak_allocated == live_alloc.max_memory_allocated()
    assert replayed.memory_allocated() == live_alloc.memory_allocated()
    assert [(s["address"], s["total_size"]) for s in replayed.snapshot()["segments"]] == \
        [(s["address"], s["total_size"]) for s in live_alloc.snapshot()["segments"]]


def test_multi_device_expandable_snapshot_with_an_oom_replays_each_device(tmp_path, capsys):
    config = "expandable_segments:True"
    snaps = []
    for d, (capacity, scale) in enumerate([("2GiB", 1), ("1GiB", 4)]):
        alloc = CachingAllocator(SimulatedGPU(capacity, index=d), config)
        live: dict = {}
        steps = training(30, seed=d, scale=scale)
        run(alloc, steps[:40], live)  # before recording: the model and a few steps
        alloc.record_memory_history()
        run(alloc, steps[40:], live)
        snaps.append(alloc.snapshot())
    snap = as_pytorch(snaps)
    assert any(e["action"] == "oom" for e in snap["device_traces"][1])
    assert not any(e["action"] == "oom" for e in snap["device_traces"][0])
    path = tmp_path / "two_devices.pickle"
    path.write_bytes(pickle.dumps(snap))

    t1 = read_device_trace(snap, 1)
    cap = t1.capacity_at_oom()
    assert cap == 1024 * MiB  # reserved at the OOM plus the driver's free bytes: the whole simulated device
    rows = what_if_trace(t1, config, [""], cap, fit=False)
    recorded_oom = t1.oom_entries[0]
    assert rows[0].label == "as recorded (expandable_segments:True)"
    assert rows[0].first_failure_entry == recorded_oom  # the recorded failure, at its entry
    assert rows[0].ooms == len(t1.oom_entries)
    for d in (0, 1):
        assert check_trace(read_device_trace(snap, d), config).ok

    assert main(["replay", str(path), "--no-fit"]) in (0, 1)
    out = capsys.readouterr().out
    assert "device 0:" in out and "device 1:" in out and f"the oom at trace entry {recorded_oom}" in out
    assert main(["replay", str(path), "--device", "1", "--json", "--no-fit"]) in (0, 1)
    (dev,) = json.loads(capsys.readouterr().out)["devices"]
    assert dev["device"] == 1 and dev["results"][0]["first_failure_entry"] == recorded_oom
    assert main(["replay", str(path), "--device", "5"]) == 2
    assert "device 5" in capsys.readouterr().err


def test_the_stepper_reads_and_replays_a_real_run_as_replay_does():
    pytest.importorskip("matplotlib")
    from minialloc.viz import Replay

    path = REAL / "magma27-assignment2-systems.pickle"
    snap = read_snapshot(path)
    trace = read_device_trace(snap, 0, str(path))
    stepper_replay = Replay.from_snapshot(path)
    assert len(stepper_replay) == len(trace.ops)
    middle = len(trace.ops) // 2
    alloc = stepper_replay.goto(middle)
    _, same = replay_trace(trace, recorded_config(snap), at_recorded=True, until=trace.ops[middle][1])
    assert (alloc.memory_allocated(), alloc.memory_reserved()) == (same.memory_allocated(), same.memory_reserved())
    end = stepper_replay.goto(len(stepper_replay))
    assert [(s["address"], [(b["address"], b["state"]) for b in s["blocks"]]) for s in end.snapshot()["segments"]] \
        == [(s["address"], [(b["address"], b["state"]) for b in s["blocks"]]) for s in snap["segments"]]


@pytest.mark.parametrize("path", SINGLE_DEVICE, ids=lambda p: p.stem)
def test_the_timeline_starts_from_the_state_at_the_first_entry(path):
    pytest.importorskip("matplotlib")
    from minialloc.viz import timeline_data

    snap = read_snapshot(path)
    trace = read_device_trace(snap, 0, str(path))
    tl = timeline_data(snap)
    assert tl.reserved[0] == trace.reserved_at_start and tl.reserved.max() == trace.recorded_peak_reserved
    live_at_end = sum(b["requested_size"] for s in snap["segments"] for b in s["blocks"]
                      if b["state"] == "active_allocated")
    assert tl.allocated[0] == sum(trace.live_at_start.values()) and tl.allocated[-1] == live_at_end


def test_a_device_smaller_than_the_reserved_start_and_settings_that_do_not_match_the_run():
    from minialloc.replay import StartStateDoesNotFit, verdict

    path = REAL / "wedsonlin-medium128-training.pickle"
    snap = read_snapshot(path)
    trace = read_device_trace(snap, 0, str(path))
    with pytest.raises(StartStateDoesNotFit, match=r"6\.74 GiB is already reserved at the first trace entry"):
        what_if_trace(trace, "", [], 6 * 2**30, fit=False)
    assert main(["replay", str(path), "--capacity", "0"]) == 2
    # the same trace under settings it was not recorded with: the replay leaves the run, and says so
    snap["allocator_settings"] = dict(snap["allocator_settings"], max_split_size=20 * MiB)
    trace = read_device_trace(snap, 0, str(path))
    (row,) = what_if_trace(trace, "max_split_size_mb:20", [], fit=False, relaid=False)
    assert row.diverged_at == 566 and row.peak_reserved > trace.recorded_peak_reserved
    assert verdict([row], None).startswith("warning: the replay under the recorded settings diverges from the run "
                                           "at trace entry 566")
