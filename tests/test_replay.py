"""The what-if replay tool and the `minialloc` command."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from minialloc import CachingAllocator, MiB, SimulatedGPU, dump_snapshot
from minialloc.cli import main
from minialloc.replay import TraceError, events_from_snapshot, read_trace, replay, what_if
from minialloc.workloads import WORKLOADS, Event, canonical_scenario, inference_batches, training_steps

FIXTURE = Path(__file__).parent / "fixtures" / "pytorch_snapshot.pickle"


@pytest.mark.parametrize("config", ["", "expandable_segments:True", "max_split_size_mb:64"])
def test_replay_of_a_snapshot_reproduces_the_live_peak_reserved(tmp_path, config):
    gpu = SimulatedGPU("24GiB")
    live = CachingAllocator(gpu, config)
    live.record_memory_history()
    events = training_steps(steps=3, layers=6) + [Event("empty_cache")] + inference_batches(requests=60)
    replay(events, live)
    path = tmp_path / "run.pickle"
    dump_snapshot(live, path)
    replayed = what_if(read_trace(path), "24GiB", [config])[0]
    assert replayed.peak_reserved == live.max_memory_reserved()
    assert replayed.peak_allocated == live.max_memory_allocated()
    assert replayed.ooms == 0


def test_empty_cache_calls_are_recovered_from_the_trace(tmp_path):
    a = CachingAllocator(SimulatedGPU("1GiB"), "")
    a.record_memory_history()
    p = a.malloc(100 * MiB)
    a.free(p)
    a.empty_cache()
    q = a.malloc(50 * MiB)
    a.free(q)
    events = events_from_snapshot(a.snapshot())
    assert [e.op for e in events] == ["alloc", "free", "empty_cache", "alloc", "free"]


def test_replay_counts_ooms_and_names_the_first_failing_event():
    events = canonical_scenario()
    native, expandable = what_if(events, "8GiB", ["", "expandable_segments:True"])
    assert native.ooms == 1 and native.first_failure == len(events) - 1
    assert "Tried to allocate 2.00 GiB" in native.first_failure_message
    assert expandable.ooms == 0 and expandable.first_failure is None
    assert 0 < native.efficiency <= 1


def test_pytorch_written_snapshot_replays():
    events = read_trace(FIXTURE)
    assert any(e.op == "alloc" for e in events)
    (result,) = what_if(events, "8GiB", [""])
    assert result.peak_allocated > 0


def test_rmm_csv(tmp_path):
    path = tmp_path / "rmm.csv"
    path.write_text(
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "1,0.1,allocate,0x7f0000000000,3145728,0x0\n"
        "1,0.2,allocate,0x7f0000400000,1024,0x0\n"
        "1,0.3,free,0x7f0000000000,3145728,0x0\n"
        "1,0.4,allocate failure,0x0,999999999999,0x0\n"
        "1,0.5,free,0x7f0000400000,1024,0x0\n"
    )
    events = read_trace(path)
    assert [(e.op, e.size) for e in events] == [("alloc", 3 * MiB), ("alloc", 1024), ("free", 0), ("free", 0)]
    (r,) = what_if(events, "1GiB", [""])
    assert r.peak_reserved == 22 * MiB


@pytest.mark.parametrize(
    "body,words",
    [
        ("Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,abc,0x0\n", "row 2"),
        ("Thread,Time,Action,Pointer,Size,Stream\n1,0,free,0x10,16,0x0\n", "row 2: frees pointer 0x10"),
        ("Thread,Time,Action,Pointer,Size,Stream\n1,0,resize,0x10,16,0x0\n", "unknown action"),
        ("Thread,Time,Verb,Pointer,Size\n1,0,allocate,0x10,16\n", "not an RMM log"),
    ],
)
def test_bad_csv_rows_name_file_and_row(tmp_path, body, words):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(TraceError, match=words) as e:
        read_trace(path)
    assert str(path) in str(e.value)


def test_bad_snapshots(tmp_path):
    a = CachingAllocator(SimulatedGPU("1GiB"), "")
    a.record_memory_history()
    a.free(a.malloc(512))
    snap = a.snapshot()
    good = tmp_path / "good.pickle"
    dump_snapshot(snap, good)
    truncated = tmp_path / "truncated.pickle"
    truncated.write_bytes(good.read_bytes()[:40])
    with pytest.raises(TraceError, match="truncated.pickle"):
        read_trace(truncated)
    foreign = tmp_path / "foreign.pickle"
    foreign.write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    with pytest.raises(TraceError, match="foreign.pickle"):
        read_trace(foreign)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(TraceError, match="neither a snapshot"):
        read_trace(text)
    # a trace that frees an address it never allocated (the ring buffer dropped its start)
    trace = snap["device_traces"][0]
    cut = dict(snap, device_traces=[[e for e in trace if e["action"] != "alloc"]])
    with pytest.raises(TraceError, match=r"trace entry \d+: frees address"):
        events_from_snapshot(cut, "cut.pickle")
    with pytest.raises(TraceError, match="no trace"):
        events_from_snapshot(dict(snap, device_traces=[]), "empty.pickle")


def test_replay_rejects_inconsistent_event_lists():
    a = CachingAllocator(SimulatedGPU("1GiB"), "")
    with pytest.raises(TraceError, match="event 1: frees 'y'"):
        replay([Event("alloc", "x", 10), Event("free", "y")], a, "mine")
    with pytest.raises(TraceError, match="allocated again"):
        replay([Event("alloc", "z", 10), Event("alloc", "z", 10)], CachingAllocator(SimulatedGPU("1GiB"), ""))


def test_workload_generators_are_deterministic_and_balanced():
    for name, gen in WORKLOADS.items():
        events = gen()
        assert events == gen(), name
        allocs = {e.name for e in events if e.op == "alloc"}
        frees = {e.name for e in events if e.op == "free"}
        assert frees <= allocs and all(e.size > 0 for e in events if e.op == "alloc")


def test_cli_demo(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "Tried to allocate 2.00 GiB" in out and "succeeded" in out and "empty_cache() and retry" in out
    assert "4.68 GiB" in out and "(5.02 GB)" in out


def test_cli_replay_json(tmp_path, capsys):
    a = CachingAllocator(SimulatedGPU("8GiB"), "")
    a.record_memory_history()
    replay(canonical_scenario(), a)
    path = tmp_path / "canon.pickle"
    dump_snapshot(a, path)
    assert main(["replay", str(path), "--json", "--conf", "", "--conf", "expandable_segments:True"]) == 0
    (dev,) = json.loads(capsys.readouterr().out)["devices"]
    # the capacity comes from the trace's oom entry: reserved then plus the driver's free bytes
    assert dev["capacity"] == 8 * 2**30 and "oom" in dev["capacity_source"]
    assert [r["label"] for r in dev["results"]] == ["as recorded (native)", "expandable_segments:True"]
    assert [r["ooms"] for r in dev["results"]] == [1, 0]
    failing = dev["results"][0]["first_failure_entry"]
    assert a.snapshot()["device_traces"][0][failing]["action"] == "oom"
    assert "expandable_segments:True saves this run" in dev["verdict"]
    # the smallest device the expandable run fits on is at most the one it ran on
    assert dev["results"][1]["fits_on"] <= 8 * 2**30
    assert main(["replay", str(path), "--conf", "max_split_size_mb:128", "--no-fit"]) == 0
    assert "max_split_size_mb:128" in capsys.readouterr().out
    assert main(["replay", str(tmp_path / "missing.pickle")]) == 2
    assert "missing.pickle" in capsys.readouterr().err


def test_console_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "minialloc.cli", "demo"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_pytorch_memory_viz_reads_minialloc_snapshots(tmp_path):
    pytest.importorskip("torch")
    a = CachingAllocator(SimulatedGPU("8GiB"), "")
    replay(canonical_scenario(), a)
    p = a.malloc(3 * MiB)
    a.record_stream(p, 1)
    a.free(p)
    path = tmp_path / "snap.pickle"
    dump_snapshot(a, path)
    for cmd in (["stats"], ["trace"], ["trace_plot", "-o", str(tmp_path / "t.html")]):
        out = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", cmd[0], str(path), *cmd[1:]],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    stats = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)],
                           capture_output=True, text=True, timeout=120).stdout
    assert "segments: 8" in stats and "total_reserved: 6.6GiB" in stats and "total_allocated: 3.3GiB" in stats
    assert (tmp_path / "t.html").stat().st_size > 1000


def test_cli_demo_plot_and_plot_command(tmp_path, capsys):
    assert main(["demo", "--plot", str(tmp_path / "demo")]) == 0
    written = sorted(p.name for p in (tmp_path / "demo").iterdir())
    assert any(n.endswith(".png") for n in written) and any(n.endswith(".svg") for n in written)
    a = CachingAllocator(SimulatedGPU("8GiB"), "")
    replay(canonical_scenario()[:-1], a)
    dump_snapshot(a, tmp_path / "snap.pickle")
    assert main(["plot", str(tmp_path / "snap.pickle"), "-o", str(tmp_path / "plots")]) == 0
    assert {p.suffix for p in (tmp_path / "plots").iterdir()} == {".png", ".svg"}


# -- review of issue 13 -------------------------------------------------------------------------------------------
def test_from_empty_keeps_the_recorded_figures_and_says_what_it_leaves_out():
    from minialloc.replay import verdict, what_if_trace
    from minialloc.trace import read_device_trace

    a = CachingAllocator(SimulatedGPU("1GiB"), "")
    held = [a.malloc(50 * MiB) for _ in range(3)]  # 150 MiB live before the recording
    a.record_memory_history()
    a.free(a.malloc(20 * MiB))
    a.free(held[0])
    snap = a.snapshot()
    full = read_device_trace(snap, 0)
    empty = read_device_trace(snap, 0, from_empty=True)
    # the run's own figures, whichever way it is replayed
    assert empty.recorded_peak_reserved == full.recorded_peak_reserved == a.max_memory_reserved()
    assert empty.recorded_reserved_at_start == full.reserved_at_start == 150 * MiB
    assert empty.recorded_live_at_start == full.recorded_live_at_start == (3, 150 * MiB)
    rows = what_if_trace(empty, "", [], 1024 * MiB, fit=False)
    v = verdict(rows, 1024 * MiB, empty.reserved_at_start)
    assert "leaving out the 150.00 MiB the run had reserved at the first trace entry (3 blocks live" in v
    assert v.startswith("the replay from an empty GPU fits in 1.00 GiB") and "the run fits" not in v


def test_configs_are_checked_before_any_replay_with_pytorch_keys_only():
    from minialloc.replay import check_configs

    check_configs(["", "expandable_segments:True", "max_split_size_mb:128,garbage_collection_threshold:0.8"])
    with pytest.raises(ValueError) as e:
        check_configs(["foo:bar"])
    text = str(e.value)
    assert "'foo:bar'" in text and "expandable_segments" in text
    assert "MINIALLOC_ALLOC_CONF" not in text and "debug_guards" not in text and "backend" not in text
    with pytest.raises(ValueError, match="only PyTorch's keys"):
        check_configs(["backend:native"])


def test_minialloc_sizes_read_well_and_decimal_units_are_pointed_out():
    from minialloc.sizes import GiB, decimal_size_hint, format_size, readable_size

    assert format_size(GiB) == "1024.00 MiB"  # PyTorch's own format, kept in its message
    assert readable_size(GiB) == "1.00 GiB" and readable_size(MiB) == "1.00 MiB" and readable_size(5) == "5 bytes"
    assert decimal_size_hint("80GB") == "(decimal; did you mean 80GiB?)"
    assert decimal_size_hint("80GiB") == "" and decimal_size_hint("1000") == ""


def test_the_expandable_rebuilt_state_under_another_setting_is_flagged():
    from minialloc.replay import verdict, what_if_trace
    from minialloc.trace import read_device_trace, recorded_config

    a = CachingAllocator(SimulatedGPU("4GiB"), "expandable_segments:True")
    held = [a.malloc(100 * MiB) for _ in range(5)]
    a.record_memory_history()
    for p in held[:3]:
        a.free(p)
    [a.malloc(50 * MiB) for _ in range(4)]
    snap = a.snapshot()
    trace = read_device_trace(snap, 0)
    rows = what_if_trace(trace, recorded_config(snap), ["", "max_split_size_mb:256"], fit=False, relaid=False)
    assert rows[0].notes == [] and rows[1].notes and rows[2].notes
    v = verdict(rows, None)
    (note,) = [line for line in v.splitlines() if line.startswith("note:")]  # one line for both rows
    assert note.startswith("note: native and max_split_size_mb:256: replayed on top of the run's expandable")
    assert "--from-empty" in note


def test_files_that_cannot_be_a_snapshot_are_named_for_what_they_are(tmp_path):
    from minialloc.replay import load_trace_file

    (tmp_path / "adir").mkdir()
    (tmp_path / "empty.pickle").write_bytes(b"")
    (tmp_path / "snap.json").write_text('{"segments": []}')
    cases = {"adir": "is a directory, not a snapshot pickle", "missing.pickle": "no such file",
             "empty.pickle": "empty file, not the pickle", "snap.json": "JSON, not the pickle"}
    for name, words in cases.items():
        with pytest.raises(TraceError, match=words):
            load_trace_file(tmp_path / name)
        with pytest.raises(TraceError, match=words):
            read_trace(tmp_path / name)


def expandable_run_traced_mid_run(capacity: str, oom: bool) -> dict:
    """An expandable run whose history is switched on after its large pool was mapped: the small pools and stream
    1's reservations are first mapped inside the trace (issue 24, item 3). With oom, the last request fails."""
    from minialloc import CachingAllocator, MiB, SimulatedGPU
    from minialloc.oom import OutOfMemoryError

    a = CachingAllocator(SimulatedGPU(capacity), "expandable_segments:True")
    before = [a.malloc(n * MiB) for n in (40, 100, 30)]
    a.record_memory_history()
    xs = [a.malloc(500_000), a.malloc(50 * MiB, stream=1), a.malloc(3000, stream=1), a.malloc(64 * MiB)]
    a.free(xs[0])
    a.free(xs[1])
    after = [a.malloc(700_000), a.malloc(60 * MiB, stream=1), a.malloc(20 * MiB)]
    if oom:
        with pytest.raises(OutOfMemoryError):
            a.malloc(900 * MiB, stream=1)
        after.append(a.malloc(2 * MiB, stream=1))  # the run goes on after the failure
    assert before and after
    return a.snapshot()


@pytest.mark.parametrize(("capacity", "oom"), [("8GiB", False), ("600MiB", True)])
def test_expandable_reservations_first_mapped_inside_the_trace_are_placed_where_the_run_had_them(capacity, oom):
    from minialloc.replay import check_trace
    from minialloc.trace import read_device_trace, recorded_config

    snap = expandable_run_traced_mid_run(capacity, oom)
    kinds = {(s["stream"], s["segment_type"]) for s in snap["segments"]}
    assert kinds == {(0, "large"), (0, "small"), (1, "large"), (1, "small")}
    trace = read_device_trace(snap, 0)
    assert trace.reserved_at_start == 180 * 2**20  # only stream 0's large pool was mapped at the first entry
    check = check_trace(trace, recorded_config(snap))
    assert check.ok and check.at_recorded_address == check.allocations, check.summary()
    assert check.recorded_ooms == check.reproduced_ooms == (1 if oom else 0)
    assert (check.capacity is not None) == oom


def test_a_trace_that_starts_mid_run_gets_re_laid_rows_that_start_from_its_live_blocks(tmp_path, capsys):
    """Issue 24: the what-if for a trace switched on mid-run. Each config's re-laid row starts from the blocks
    at the first entry (live ones at their requested size, cached free ones at theirs, same streams), placed by
    that config's policy, and the cached ones freed again."""
    from minialloc import CachingAllocator, MiB, SimulatedGPU
    from minialloc.replay import replay_trace, what_if_trace
    from minialloc.trace import read_device_trace

    a = CachingAllocator(SimulatedGPU("4GiB"), "")
    kept = [a.malloc(n * MiB) for n in (30, 5, 7, 12)]
    for p in kept[1::2]:
        a.free(p)  # holes the run keeps cached: the state at the first entry is fragmented
    a.record_memory_history()
    later = [a.malloc(n * MiB) for n in (25, 3)]
    a.free(kept[0])
    snap = a.snapshot()
    trace = read_device_trace(snap, 0)
    rows = what_if_trace(trace, "", ["expandable_segments:True"], fit=False)
    assert [r.label for r in rows] == ["as recorded (native)", "native, re-laid", "expandable_segments:True, re-laid"]
    assert [r.relaid for r in rows] == [False, True, True]
    # re-laid under the recorded settings, the blocks fill the run's own segments again: the row is the run's
    assert rows[1].peak_reserved == rows[0].peak_reserved == trace.recorded_peak_reserved
    _, relaid = replay_trace(trace, "", relaid=True, until=trace.ops[0][1])
    assert relaid.memory_allocated() == sum(b["size"] for s in trace.start_segments for b in s["blocks"]
                                            if b["state"] == "active_allocated")
    assert relaid.memory_reserved() == trace.reserved_at_start  # the holes stay cached, as the run kept them
    # the live blocks alone (30 and 7 MiB) would need less than the run's segments held: the cache is the peak
    _, live_only = replay_trace(trace, "", relaid=True, until=trace.ops[0][1], cache=False)
    assert live_only.memory_reserved() < trace.reserved_at_start
    assert what_if_trace(trace, "", ["expandable_segments:True"], fit=False, relaid=False)[1].label == \
        "expandable_segments:True"
    path = tmp_path / "mid.pickle"
    path.write_bytes(pickle.dumps(snap))
    assert main(["replay", str(path), "--no-fit"]) == 0
    out = capsys.readouterr().out
    assert "re-laid from the live and cached blocks at the first entry:" in out
    assert "rows marked re-laid start from the 2 live blocks and the cached free memory" in out
    assert later


def test_the_re_laid_start_re_expresses_the_cache_under_each_config():
    """Issue 24: a 600 MiB segment the run split for a 300 MiB block (the rest cached). Re-laid, the recorded
    settings rebuild it as it was; max_split_size_mb:256 keeps the 600 MiB request's oversize block whole, so
    the 300 MiB block needs a segment of its own and the remnant of the split never exists; the live bytes are
    the same under each, and a peak counts from the first entry on."""
    from minialloc import CachingAllocator, MiB, SimulatedGPU
    from minialloc.replay import replay_trace
    from minialloc.trace import read_device_trace

    a = CachingAllocator(SimulatedGPU("4GiB"), "")
    a.free(a.malloc(600 * MiB))
    held = [a.malloc(300 * MiB), a.malloc(4096)]
    a.record_memory_history()
    a.malloc(50 * MiB)
    a.free(held[0])
    trace = read_device_trace(a.snapshot(), 0)
    assert trace.reserved_at_start == 602 * MiB
    segments = {}
    for conf in ("", "expandable_segments:True", "max_split_size_mb:256"):
        _, start = replay_trace(trace, conf, relaid=True, until=trace.ops[0][1])
        assert start.memory_allocated() == 300 * MiB + 4096
        assert start.memory_stats()["reserved_bytes.all.peak"] == start.memory_reserved()
        segments[conf] = sorted(s["total_size"] // MiB for s in start.snapshot()["segments"])
    assert segments[""] == segments["expandable_segments:True"] == [2, 600]
    assert segments["max_split_size_mb:256"] == [2, 300, 600]
