"""Tests for minialloc.snapshot: PyTorch snapshot pickles in and out, bad files refused with their place."""

from __future__ import annotations

import copy
import importlib.util
import os
import pickle
import runpy
import shlex
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

from minialloc.snapshot import SnapshotError, dump_snapshot, load_snapshot, validate_snapshot

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE = FIXTURES / "pytorch_snapshot.pickle"
build_snapshot = runpy.run_path(str(FIXTURES / "make_pytorch_snapshot.py"))["build_snapshot"]

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


def write_pickle(path: Path, obj: Any) -> Path:
    path.write_bytes(pickle.dumps(obj))
    return path


def assert_refused(path: Path, *places: str) -> SnapshotError:
    with pytest.raises(SnapshotError) as info:
        load_snapshot(path)
    message = str(info.value)
    assert str(path) in message
    for place in places:
        assert place in message
    return info.value


# --- the PyTorch fixture ---------------------------------------------------------------------------


def test_fixture_is_what_the_script_builds() -> None:
    assert load_snapshot(FIXTURE) == build_snapshot(), "run tests/fixtures/make_pytorch_snapshot.py"


def test_load_fixture() -> None:
    snap = load_snapshot(FIXTURE)
    kinds = [(s["segment_type"], s["total_size"], s["is_expandable"]) for s in snap["segments"]]
    assert sorted(kinds) == [("large", 20 << 20, False), ("large", 20 << 20, True), ("small", 2 << 20, False)]
    small = next(s for s in snap["segments"] if s["segment_type"] == "small")
    first_two = [(b["size"], b["state"]) for b in small["blocks"][:2]]
    assert first_two == [(512, "inactive"), (512, "active_allocated")]
    actions = {e["action"] for e in snap["device_traces"][0]}
    assert {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_map", "segment_unmap",
            "oom"} <= actions
    assert snap["allocator_settings"]["expandable_segments"] is True


def run_memory_viz(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@needs_torch
def test_memory_viz_stats_reads_fixture(tmp_path: Path) -> None:
    done = run_memory_viz("stats", str(FIXTURE), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "segments: 3" in done.stdout
    assert "total_reserved: 42.0MiB" in done.stdout
    assert "total_allocated: 15.0MiB" in done.stdout


@needs_torch
def test_memory_viz_trace_reads_fixture(tmp_path: Path) -> None:
    done = run_memory_viz("trace", str(FIXTURE), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "16 entries" in done.stdout
    assert "cudaMalloc(" in done.stdout and "[0:3.0MiB]" in done.stdout
    assert "raise OutOfMemoryError # 8.0GiB requested, 1.5GiB free in CUDA" in done.stdout


@needs_torch
@pytest.mark.parametrize("plot", ["trace_plot", "segment_plot"])
def test_memory_viz_plots_write_html_offline(tmp_path: Path, plot: str) -> None:
    out = tmp_path / "out.html"
    done = run_memory_viz(plot, str(FIXTURE), "-o", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert "<html>" in html and "snapshot.pickle" in html


# --- dump ------------------------------------------------------------------------------------------


def test_round_trip(tmp_path: Path) -> None:
    snap = build_snapshot()
    dump_snapshot(snap, tmp_path / "snap.pickle")
    assert load_snapshot(tmp_path / "snap.pickle") == snap
    assert os.listdir(tmp_path) == ["snap.pickle"]


def test_dump_object_with_snapshot_method(tmp_path: Path) -> None:
    class Allocator:
        def snapshot(self) -> dict[str, Any]:
            return build_snapshot()

    dump_snapshot(Allocator(), tmp_path / "snap.pickle")
    assert load_snapshot(tmp_path / "snap.pickle") == build_snapshot()


def test_dump_refuses_other_objects(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="snapshot"):
        dump_snapshot([1, 2], tmp_path / "snap.pickle")


def test_dump_invalid_snapshot_leaves_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(b"the previous snapshot")
    snap = build_snapshot()
    del snap["segments"][0]["blocks"][1]["size"]
    with pytest.raises(SnapshotError, match=r"segments\[0\]\.blocks\[1\]: missing key 'size'") as info:
        dump_snapshot(snap, path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == b"the previous snapshot"
    assert os.listdir(tmp_path) == ["snap.pickle"]


def test_dump_failing_write_leaves_existing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(b"the previous snapshot")

    def broken_dump(obj: Any, f: Any) -> None:
        f.write(b"half a pickle")
        raise OSError("disk full")

    monkeypatch.setattr(pickle, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        dump_snapshot(build_snapshot(), path)
    assert path.read_bytes() == b"the previous snapshot"
    assert os.listdir(tmp_path) == ["snap.pickle"]


def test_dump_refuses_values_load_could_not_read(tmp_path: Path) -> None:
    snap = build_snapshot()
    snap["segments"][1]["blocks"][0]["frames"] = OrderedDict()
    with pytest.raises(SnapshotError, match=r"segments\[1\]\.blocks\[0\]\.frames: OrderedDict"):
        dump_snapshot(snap, tmp_path / "snap.pickle")


# --- files that are not snapshots --------------------------------------------------------------------


class Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def test_malicious_pickle_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = write_pickle(tmp_path / "evil.pickle", {"segments": [], "payload": Evil(marker)})
    error = assert_refused(path, "pickle stream", "system")
    assert "nothing from the file ran" in str(error)
    assert not marker.exists()


def test_pickle_needing_any_class_is_refused(tmp_path: Path) -> None:
    path = write_pickle(tmp_path / "ordered.pickle", OrderedDict(segments=[]))
    assert_refused(path, "collections.OrderedDict")


def test_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "cut.pickle"
    path.write_bytes(FIXTURE.read_bytes()[:300])
    assert_refused(path, "pickle stream", "not a readable pickle", "cut short")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.pickle"
    path.write_bytes(b"")
    assert_refused(path, "pickle stream", "the file is empty")


def test_text_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.pickle"
    path.write_text("segments: none, this is a text file\n")
    assert_refused(path, "pickle stream", "not a readable pickle")


def test_pickle_of_a_list(tmp_path: Path) -> None:
    path = write_pickle(tmp_path / "list.pickle", build_snapshot()["segments"])
    assert_refused(path, "top level", "got a list", "{'segments': the_list}")


def test_missing_segments(tmp_path: Path) -> None:
    path = write_pickle(tmp_path / "s.pickle", {"device_traces": []})
    assert_refused(path, "top level: missing key 'segments'")


def test_segments_not_a_list(tmp_path: Path) -> None:
    path = write_pickle(tmp_path / "s.pickle", {"segments": {"address": 0}})
    assert_refused(path, "segments: expected a list, got dict")


def test_block_missing_size(tmp_path: Path) -> None:
    snap = build_snapshot()
    del snap["segments"][2]["blocks"][1]["size"]
    assert_refused(write_pickle(tmp_path / "s.pickle", snap), "segments[2].blocks[1]: missing key 'size'")


def test_trace_entry_with_unknown_action(tmp_path: Path) -> None:
    snap = build_snapshot()
    snap["device_traces"][0][3]["action"] = "allocate"
    path = write_pickle(tmp_path / "s.pickle", snap)
    error = assert_refused(path, "device_traces[0][3].action", "'allocate'")
    assert "segment_unmap" in str(error)  # names the actions PyTorch writes


def test_non_int_address(tmp_path: Path) -> None:
    snap = build_snapshot()
    snap["segments"][1]["address"] = "0x7f3a1e000000"
    assert_refused(write_pickle(tmp_path / "s.pickle", snap), "segments[1].address: expected int, got str")


def test_bool_is_not_an_int(tmp_path: Path) -> None:
    snap = build_snapshot()
    snap["device_traces"][0][0]["size"] = True
    path = write_pickle(tmp_path / "s.pickle", snap)
    assert_refused(path, "device_traces[0][0].size: expected int, got bool")


@pytest.mark.parametrize(
    ("change", "place"),
    [
        (lambda s: s["segments"][0]["blocks"][0].update(state="free"), "segments[0].blocks[0].state"),
        (lambda s: s["segments"][0].update(segment_type="huge"), "segments[0].segment_type"),
        (lambda s: s["segments"][0].update(total_size=1), "segments[0]: the blocks add up to"),
        (lambda s: s["segments"][0].update(segment_pool_id=(0,)), "segments[0].segment_pool_id"),
        (lambda s: s["segments"][0]["frames"][0].pop("line"), "segments[0].frames[0]: missing key 'line'"),
        (lambda s: s.update(device_traces=[{}]), "device_traces[0]: expected a list"),
        (lambda s: s["device_traces"][0][14].pop("device_free"),
         "device_traces[0][14]: missing key 'device_free'"),
        (lambda s: s["device_traces"][0][1].pop("addr"), "device_traces[0][1]: missing key 'addr'"),
        (lambda s: s["allocator_settings"].update(expandable_segments="True"),
         "allocator_settings.expandable_segments: expected bool"),
    ],
)
def test_schema_errors_name_the_place(change: Any, place: str) -> None:
    snap = build_snapshot()
    change(snap)
    with pytest.raises(SnapshotError) as info:
        validate_snapshot(snap)
    assert str(info.value).startswith("<snapshot>: ")
    assert place in str(info.value)


# --- what PyTorch versions add or leave out ------------------------------------------------------------


def test_old_snapshot_without_traces_or_optional_keys(tmp_path: Path) -> None:
    old = {"segments": [{"address": 4096, "total_size": 1024, "stream": 0,
                         "blocks": [{"size": 1024, "state": "active_allocated",
                                     "history": [{"addr": 4096, "real_size": 1000}]}]}]}
    snap = load_snapshot(write_pickle(tmp_path / "old.pickle", old))
    assert snap["device_traces"] == []
    assert snap["segments"] == old["segments"]


def test_unknown_keys_are_kept(tmp_path: Path) -> None:
    snap = build_snapshot()
    snap["segments"][0]["frames"][0]["fx_node_op"] = "call_function"
    snap["device_traces"][0][0]["pool_id"] = (0, 0)
    snap["a_future_key"] = {"anything": [1, 2.5, None, b"raw"]}
    assert load_snapshot(write_pickle(tmp_path / "new.pickle", snap)) == snap


def test_validate_does_not_change_the_snapshot() -> None:
    snap = build_snapshot()
    del snap["device_traces"]
    before = copy.deepcopy(snap)
    validate_snapshot(snap)
    assert snap == before


# --- issue 15: a minialloc snapshot as PyTorch 2.13 writes one ---------------------------------------------


def minialloc_run_snapshot() -> dict:
    from minialloc import CachingAllocator, MiB, SimulatedGPU

    a = CachingAllocator(SimulatedGPU("1GiB"), "")
    assert a.snapshot()["device_traces"] == [[]]  # nothing until history is asked for
    a.record_memory_history()
    p = a.malloc(3 * MiB)
    q = a.malloc(30 * MiB)  # a segment of its own, which empty_cache gives back
    a.free(q)
    a.empty_cache()
    a.free(p)
    return a.snapshot()


def test_minialloc_trace_entries_have_pytorchs_keys() -> None:
    snap = minialloc_run_snapshot()
    validate_snapshot(snap)
    for entry in snap["device_traces"][0]:
        # no stacks recorded: no frames key, as in PyTorch's snapshots taken with context=None
        assert list(entry)[:2] == ["action", "addr"] and "frames" not in entry
        assert entry["compile_context"] == "N/A" and entry["user_metadata"] == ""
    names = [(x["name"], x["stage"]) for x in snap["external_annotations"]]
    assert names == [("empty_cache", "START"), ("empty_cache", "END")]


@needs_torch
def test_memory_viz_trace_reads_a_minialloc_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "run.pickle"
    dump_snapshot(minialloc_run_snapshot(), path)
    done = run_memory_viz("trace", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "cudaFree(" in done.stdout and "cudaMalloc(" in done.stdout
