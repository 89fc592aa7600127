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
    replay(canonical_scenario(), a)
    path = tmp_path / "canon.pickle"
    dump_snapshot(a, path)
    assert main(["replay", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["config"] for r in out["results"]] == ["native", "expandable_segments:True"]
    assert [r["ooms"] for r in out["results"]] == [1, 0]
    assert main(["replay", str(path), "--conf", "max_split_size_mb:128"]) == 0
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
