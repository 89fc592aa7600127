"""Tests for minialloc.viz: the pictures show what the allocator holds, where it holds it, and when."""

from __future__ import annotations

import base64
import html
import importlib.util
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from minialloc import CachingAllocator, MiB, SimulatedGPU  # noqa: E402
from minialloc.cli import main as cli_main  # noqa: E402
from minialloc.oom import OutOfMemoryError  # noqa: E402
from minialloc.viz import (  # noqa: E402
    COLORS,
    Replay,
    Stepper,
    VizInputError,
    compare_configs,
    figure_texts,
    plot_segment_map,
    plot_side_by_side,
    plot_timeline,
    random_events,
    save_demo_plots,
    save_plots,
    segment_rows,
    timeline_data,
    write_trace_plot_html,
)

FIXTURE = Path(__file__).parent / "fixtures" / "pytorch_snapshot.pickle"
KIND_OF = {v.lower(): k for k, v in COLORS.items()}
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


# --- helpers ------------------------------------------------------------------------------------------------
def new_allocator(config: str = "", capacity: str = "1GiB") -> CachingAllocator:
    a = CachingAllocator(SimulatedGPU(capacity), config)
    a.record_memory_history()  # history is off until asked, as in PyTorch: these pictures read the trace
    return a


def row_blocks(fig: Figure, row: int, ax_index: int = 0) -> list[tuple[str, float, float]]:
    """(kind, x, width) of the filled block rectangles drawn on a row, left to right, read off the artists."""
    ax = fig.axes[ax_index]
    found = []
    for p in ax.patches:
        if isinstance(p, Rectangle) and p.get_fill() and p.get_gid() is None:
            if abs(p.get_y() + p.get_height() / 2 - row) < 1e-9:
                kind = KIND_OF[to_hex(p.get_facecolor())]
                found.append((kind, round(p.get_x(), 9), round(p.get_width(), 9)))
    return sorted(found, key=lambda t: t[1])


def by_gid(fig: Figure, prefix: str) -> list[Rectangle]:
    return [p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith(prefix)]


def scene() -> tuple[CachingAllocator, dict[str, int]]:
    """One 20 MiB segment holding [a 4 MiB live | 3 MiB free | 5 MiB pending on stream 1 | 8 MiB free], a
    12 MiB segment wholly live, and a 2 MiB small segment with 512 live bytes."""
    a = new_allocator()
    p = {name: a.malloc(size) for name, size in (("a", 4 * MiB), ("b", 3 * MiB), ("c", 5 * MiB))}
    a.free(p["b"])
    a.record_stream(p["c"], 1)
    a.free(p["c"])  # waits on stream 1: pending free
    p["big"] = a.malloc(12 * MiB)  # >= 10 MiB: a segment of its own, exactly 12 MiB
    p["small"] = a.malloc(512)
    return a, p


# --- segment map --------------------------------------------------------------------------------------------
def test_segment_map_draws_each_block_in_its_colour_at_its_offset() -> None:
    a, _ = scene()
    fig = plot_segment_map(a)
    assert len(by_gid(fig, "segment-")) == 3
    assert row_blocks(fig, 0) == [
        ("live", 0, 4), ("free_split", 4, 3), ("pending", 7, 5), ("free_split", 12, 8),
    ]
    assert row_blocks(fig, 1) == [("live", 0, 12)]
    small = row_blocks(fig, 2)
    assert [k for k, _, _ in small] == ["live", "free_split"]
    assert small[0][2] == pytest.approx(512 / MiB) and sum(w for _, _, w in small) == pytest.approx(2)
    (mark,) = by_gid(fig, "largest-free-block")
    assert (mark.get_x(), mark.get_width(), mark.get_y() + mark.get_height() / 2) == (12, 8, 0)
    texts = " ".join(figure_texts(fig))
    assert "largest cached free block: 8.00 MiB" in texts
    # the 512-byte live block is also drawn wider than to scale, over its free neighbour, and the label says so
    (tiny,) = by_gid(fig, "tiny-live")
    assert tiny.get_x() == 0 and tiny.get_width() > 512 / MiB and tiny.get_y() + tiny.get_height() / 2 == 2
    assert "1 tiny block drawn wider than to scale" in texts
    assert "allocated 16.00 MiB" in texts and "reserved 34.00 MiB" in texts
    assert "device free 990.00 MiB" in texts  # read from the allocator's device
    assert "offset in the segment (MiB)" in texts


def test_whole_free_segment_is_its_own_colour_and_the_largest_free_block() -> None:
    a, _ = scene()
    a.free(a.malloc(30 * MiB))  # a segment of its own, then wholly free: empty_cache would return it
    fig = plot_segment_map(a.snapshot(), device_free=123 * MiB)
    assert len(by_gid(fig, "segment-")) == 4
    assert row_blocks(fig, 3) == [("free_whole", 0, 30)]  # rows in address order: the newest segment last
    (mark,) = by_gid(fig, "largest-free-block")
    assert (mark.get_x(), mark.get_width(), mark.get_y() + mark.get_height() / 2) == (0, 30, 3)
    assert "device free 123.00 MiB" in " ".join(figure_texts(fig))


def expandable_scene() -> CachingAllocator:
    a = new_allocator("expandable_segments:True")
    ptrs = [a.malloc(s * MiB) for s in (30, 30, 50, 30, 20, 30)]
    for i in (1, 2, 4):
        a.free(ptrs[i])
    a.empty_cache()  # unmaps the wholly free pages: the one reservation now has three mapped ranges
    return a


def test_expandable_ranges_of_one_reservation_share_a_row_with_unmapped_gaps() -> None:
    a = expandable_scene()
    snap = a.snapshot()
    assert len(snap["segments"]) == 3
    for reservations in (None, [(s.ptr, s.size) for s in a.expandable_segments]):
        rows = segment_rows(snap, reservations)
        assert len(rows) == 1 and rows[0].ranges == 3 and rows[0].expandable
    fig = plot_segment_map(a)
    assert len(by_gid(fig, "segment-")) == 1
    segs = snap["segments"]
    ends = [s["address"] + s["total_size"] for s in segs]
    gaps = [(end - segs[0]["address"], n["address"] - end) for end, n in zip(ends, segs[1:], strict=False)]
    unmapped = [(x, w) for kind, x, w in row_blocks(fig, 0) if kind == "unmapped"]
    assert unmapped == [(off / MiB, size / MiB) for off, size in gaps]
    grey = COLORS["unmapped"].lower()
    assert all(p.get_hatch() for p in fig.axes[0].patches if to_hex(p.get_facecolor()) == grey)
    assert "unmapped pages (expandable segment)" in figure_texts(fig)


def test_pytorch_snapshot_file_is_drawn() -> None:
    fig = plot_segment_map(str(FIXTURE))
    assert len(by_gid(fig, "segment-")) == 3
    assert by_gid(fig, "largest-free-block")


def test_500_segments_render_with_a_bounded_number_of_artists() -> None:
    a = new_allocator(capacity="80GiB")
    ptrs = [a.malloc((10 + i % 7 * 2) * MiB) for i in range(500)]  # >= 10 MiB: one segment each
    for p in ptrs[::3]:
        a.free(p)
    fig = plot_segment_map(a, max_rows=40)
    ax = fig.axes[0]
    assert len(ax.get_yticklabels()) == 40
    assert len(ax.patches) + len(ax.collections) + len(ax.texts) < 200
    assert len(by_gid(fig, "segment-")) == 39 and by_gid(fig, "summary-row")
    assert "last row: 461 smaller segments" in ax.get_xlabel()
    assert by_gid(fig, "largest-free-block")  # promoted into view, never hidden in the summary


def test_long_rows_wrap_onto_continuation_lines() -> None:
    a = new_allocator("expandable_segments:True", capacity="8GiB")
    a.malloc(512)  # a small-pool expandable range: 2 MiB
    for _ in range(30):
        a.malloc(40 * MiB)  # one large-pool range growing to 1.2 GiB: 600 times longer
    fig = plot_segment_map(a)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(by_gid(fig, "segment-")) == 2 and any(label.startswith("⋯ +") for label in labels)
    assert "continue on the next line" in fig.axes[0].get_xlabel()
    assert len(plot_segment_map(a, wrap=MiB, max_rows=10).axes[0].get_yticklabels()) <= 10


def test_a_row_of_thousands_of_blocks_is_drawn_as_collections() -> None:
    a = new_allocator()
    ptrs = [a.malloc(512) for _ in range(4096)]  # fills one 2 MiB small segment
    for p in ptrs[::2]:
        a.free(p)
    fig = plot_segment_map(a)
    ax = fig.axes[0]
    assert len(ax.patches) < 10
    kinds = {c.get_gid() for c in ax.collections}
    assert {"dense-live", "dense-free_split"} <= kinds


def test_side_by_side_shares_one_scale() -> None:
    events = random_events(1500, seed=2)
    fig = compare_configs(events, capacity="8GiB")
    left, right = fig.axes[:2]
    assert left.get_xlim() == right.get_xlim()
    assert left.get_ylim() == right.get_ylim()
    assert "default (native)" in left.get_title() and "expandable_segments:True" in right.get_title()
    fig2 = plot_side_by_side(scene()[0], {"segments": []}, ("before", "after"))
    assert "no segments: nothing is reserved" in figure_texts(fig2)


def test_side_by_side_marks_the_request_where_it_was_served_and_says_where_it_was_not() -> None:
    served = new_allocator(capacity="1GiB")
    served.malloc(4 * MiB)
    served.malloc(12 * MiB)  # best fit: cut from the 4 MiB tensor's 20 MiB segment, at offset 4 MiB
    refused = new_allocator(capacity="1GiB")
    refused.malloc(4 * MiB)
    fig = plot_side_by_side(refused, served, ("refused", "served"), request=12 * MiB)
    left, right = fig.axes[:2]
    (mark,) = [p for p in right.patches if p.get_gid() == "request-block"]
    assert to_hex(mark.get_edgecolor()) == "#d55e00" and abs(mark.get_width() - 12) < 1e-9
    assert (mark.get_x(), mark.get_y() + mark.get_height() / 2) == (4, 0)  # row 0, at offset 4 MiB
    assert not [p for p in left.patches if p.get_gid() == "request-block"]
    assert "the 12.00 MiB request is not allocated here" in left.get_title()
    assert "the 12.00 MiB request" in figure_texts(fig)


# --- timeline -----------------------------------------------------------------------------------------------
OPS = st.lists(st.tuples(st.sampled_from(["malloc", "malloc", "free", "empty_cache"]),
                         st.sampled_from([512, 4096, *(n * MiB for n in (2, 4, 6, 12, 24, 96))]),
                         st.integers(0, 10**6)), min_size=1, max_size=60)


@pytest.mark.parametrize("config", ["", "expandable_segments:True"])
@settings(max_examples=15, deadline=None)
@given(ops=OPS)
def test_timeline_equals_memory_allocated_and_reserved_during_the_replay(config: str, ops: list) -> None:
    # sizes are multiples of 512 that always split, so the requested size in the trace is the block size
    a = new_allocator(config, capacity="256MiB")
    live: list[int] = []
    samples = []
    ooms = 0
    for op, size, pick in ops:
        if op == "malloc":
            try:
                live.append(a.malloc(size))
            except OutOfMemoryError:
                ooms += 1
        elif op == "free" and live:
            a.free(live.pop(pick % len(live)))
        elif op == "empty_cache":
            a.empty_cache()
        k = len(a.snapshot()["device_traces"][0])  # the snapshot entry changes nothing: its index is "now"
        samples.append((k, a.memory_allocated(), a.memory_reserved()))
    tl = timeline_data(a)
    assert tl.note == ""
    for k, allocated, reserved in samples:
        assert (tl.allocated[k], tl.reserved[k]) == (allocated, reserved)
    assert len(tl.ooms) == ooms
    fig = plot_timeline(a)
    assert fig.axes and "peak reserved" in fig.axes[0].get_title()


def test_timeline_marks_ooms_and_release_bursts() -> None:
    a = new_allocator(capacity="128MiB")
    ptrs = [a.malloc(24 * MiB) for _ in range(4)]
    for p in ptrs:
        a.free(p)
    a.empty_cache()  # four segments back at once: a release burst
    a.malloc(24 * MiB)
    with pytest.raises(OutOfMemoryError):
        a.malloc(200 * MiB)
    tl = timeline_data(a)
    assert len(tl.releases) == 1 and tl.releases[0][2] == 4 * 24 * MiB
    assert [size for _, size, _ in tl.ooms] == [200 * MiB]
    fig = plot_timeline(a)
    ax = fig.axes[0]
    assert {"ooms", "releases"} <= {c.get_gid() for c in ax.collections}
    texts = figure_texts(fig)
    assert "OOM: 200.00 MiB" in texts and "released 96.00 MiB" in texts
    assert max(max(line.get_ydata()) for line in ax.get_lines()) == pytest.approx(128)  # capacity line


def test_truncated_trace_is_anchored_to_the_snapshot() -> None:
    a = new_allocator()
    a.record_memory_history(True, max_entries=12)  # a ring buffer that forgets the start
    ptrs = [a.malloc(4 * MiB) for _ in range(6)]
    for p in ptrs[:4]:
        a.free(p)
    tl = timeline_data(a)
    assert "mid-run" in tl.note
    assert (tl.allocated[-1], tl.reserved[-1]) == (a.memory_allocated(), a.memory_reserved())
    trace = a.snapshot()["device_traces"][0]
    lifted = timeline_data(trace)  # no snapshot to anchor to: lifted to 0
    assert lifted.allocated.min() == 0 and "lower bounds" in lifted.note
    replay = Replay(trace)  # frees of blocks allocated before the trace began are dropped, not refused
    freed = {e["addr"] for e in trace if e["action"] == "free_requested"}
    kept = sum(e["size"] for e in trace if e["action"] == "alloc" and e["addr"] not in freed)
    assert replay.goto(len(replay)).memory_allocated() == kept


def test_timeline_of_explicit_samples() -> None:
    fig = plot_timeline([(1 * MiB, 2 * MiB), (3 * MiB, 20 * MiB), (2 * MiB, 20 * MiB)])
    reserved, allocated = fig.axes[0].get_lines()[:2]
    assert list(reserved.get_ydata()) == [2, 20, 20] and list(allocated.get_ydata()) == [1, 3, 2]


# --- empty and malformed input ------------------------------------------------------------------------------
def test_empty_inputs_give_a_picture_that_says_so(tmp_path: Path) -> None:
    assert "no segments: nothing is reserved" in figure_texts(plot_segment_map({"segments": []}))
    assert "no segments: nothing is reserved" in figure_texts(plot_segment_map(new_allocator()))
    for empty in ([], {"segments": []}, {"segments": [], "device_traces": [[]]}):
        assert "no trace events: nothing to plot" in figure_texts(plot_timeline(empty))
    paths = save_plots(new_allocator(), tmp_path / "out")
    assert [p.name for p in paths] == ["segment_map.png", "segment_map.svg", "timeline.png", "timeline.svg"]
    assert all(p.stat().st_size > 0 for p in paths)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: plot_segment_map({"segments": [{"address": 1, "stream": 0, "blocks": []}]}),
     "segments[0]: missing key 'total_size'"),
    (lambda: plot_segment_map({"segments": [{"address": 1, "total_size": 512, "stream": 0,
                                             "blocks": [{"size": 512, "state": "busy"}]}]}),
     "segments[0].blocks[0].state"),
    (lambda: plot_segment_map({"segs": []}), "missing key 'segments'"),
    (lambda: plot_segment_map(42), "expected a snapshot dict, a CachingAllocator"),
    (lambda: plot_timeline([{"action": "allocate", "addr": 1, "size": 2}]), "trace[0].action"),
    (lambda: plot_timeline([{"action": "alloc", "addr": "x", "size": 2}]), "trace[0].addr"),
    (lambda: plot_timeline([(1, 2), (3,)]), "samples[1]"),
    (lambda: plot_segment_map(scene()[0], max_rows=1), "max_rows"),
    (lambda: Replay([("free", "x")]), "events[0]: free of 'x', which is not allocated"),
    (lambda: Replay([(0, 0, "x")]), "events[0]"),
    (lambda: Replay([("malloc", 512, 0, "x"), ("malloc", 512, 0, "x")]), "'x' is already allocated"),
    (lambda: Replay([]).goto(1), "step must be an int in [0, 0]"),
])
def test_malformed_input_is_refused_with_what_is_wrong(call: Any, message: str) -> None:
    with pytest.raises(VizInputError) as info:
        call()
    assert message in str(info.value)


# --- stepper ------------------------------------------------------------------------------------------------
def state(a: CachingAllocator) -> tuple[Any, dict[str, int]]:
    return a.snapshot()["segments"], a.memory_stats()


@pytest.mark.parametrize("config", ["", "expandable_segments:True"])
def test_stepper_step_n_equals_a_fresh_replay_to_n(config: str) -> None:
    events = random_events(2000, seed=5)
    replay = Replay(events, config, capacity="2GiB", checkpoint_every=150)  # small: OOMs happen

    @settings(max_examples=12, deadline=None)
    @given(st.lists(st.integers(0, len(events)), min_size=1, max_size=4))
    def moves(steps: list[int]) -> None:
        for n in steps:  # forward, backward, jumps: each from wherever the last one left the replay
            got = state(replay.goto(n))
            assert replay.position == n
            assert got == state(Replay(events, config, capacity="2GiB").goto(n))

    moves()
    replay.precompute()
    assert replay.ooms, "the scenario should run out of memory at least once"
    assert "OUT OF MEMORY" in (replay.goto(replay.ooms[0]) and replay.outcome)


def test_replaying_a_trace_rebuilds_the_allocator_state() -> None:
    # (a trace records no record_stream, so a scene without one: its replay would free at once)
    a = new_allocator()
    ptrs = [a.malloc(size) for size in (4 * MiB, 512, 3 * MiB, 12 * MiB, 5 * MiB, 4096)]
    for p in ptrs[1::2]:
        a.free(p)
    a.empty_cache()
    replay = Replay(a.snapshot()["device_traces"][0], "")
    b = replay.goto(len(replay))
    assert b.snapshot()["segments"] == a.snapshot()["segments"]


def test_stepper_frames_and_static_fallback() -> None:
    events = [(4 * MiB, 0, "x"), (3 * MiB, 0, "y"), ("free", "x"), ("empty_cache",), ("malloc", 2 * MiB)]
    stepper = Stepper(events, "")
    assert stepper.frame_png(2, quick=True).startswith(b"\x89PNG")
    fig = stepper.figure(3)
    assert row_blocks(fig, 0) == [("free_split", 0, 4), ("live", 4, 3), ("free_split", 7, 13)]
    assert "step 3/5: free 'x'" in fig.axes[0].get_title()
    bundle = stepper._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
    assert bundle["text/html"].count("data:image/png;base64,") >= 2  # this step and key frames
    assert "<Stepper over 5 events>" in bundle["text/plain"]


def test_html_export_of_a_stepper_shows_a_png(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbconvert = pytest.importorskip("nbconvert")
    bundle = Stepper([(4 * MiB, 0, "x")], "")._repr_mimebundle_()
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("Stepper(events)")
    cell.outputs = [nbformat.v4.new_output("display_data", data=bundle)]
    nb.cells.append(cell)
    html, _ = nbconvert.HTMLExporter().from_notebook_node(nb)  # no widget state saved: the fallback shows
    assert re.search(r'<img [^>]*src="data:image/png;base64,[A-Za-z0-9+/=]{100}', html)
    assert "application/vnd.jupyter.widget-view+json" not in html


@pytest.mark.skipif(importlib.util.find_spec("nbclient") is None, reason="nbclient is not installed")
def test_in_a_notebook_each_plot_shows_once_and_the_stepper_exports_a_png(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbconvert
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel picks Jupyter's own, as in JupyterLab

    cells = {  # source -> how many pictures its output must hold
        "from minialloc import viz, CachingAllocator, SimulatedGPU\n"
        "a = CachingAllocator(SimulatedGPU('1GiB'), '')\np = a.malloc(5 << 20)": 0,
        "viz.plot_segment_map(a);": 1,  # ';' as matplotlib users write it: the cell still shows the plot
        "viz.plot_segment_map(a)": 1,  # returned and shown by pyplot: once, not twice
        "fig = viz.plot_timeline(a)": 1,
        "fig": 1,  # shown again in a later cell
        "paths = viz.save_plots(a, 'plots')": 0,  # written to files, not shown
        "viz.Stepper([(4 << 20, 0, 'x'), (-1, 0, 'x')], '')": 1,
    }
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    # no widget state saved, as JupyterLab saves none unless asked: the export falls back to the pictures
    NotebookClient(nb, timeout=60, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    pictures = [sum("image/png" in o.get("data", {}) for o in c.outputs) for c in nb.cells]
    assert pictures == list(cells.values())
    assert (tmp_path / "plots" / "segment_map.png").exists()
    assert {"image/png", "text/html", "text/plain"} <= set(nb.cells[-1].outputs[0]["data"])
    html_page, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    assert html_page.count("data:image/png;base64,") >= 4 + 2  # the plots, then the stepper's fallback


# --- files, command line, PyTorch's viewer ------------------------------------------------------------------
def test_save_plots_writes_png_and_svg(tmp_path: Path) -> None:
    a, _ = scene()
    paths = save_plots(a, tmp_path / "plots")
    assert [p.suffix for p in paths] == [".png", ".svg", ".png", ".svg"]
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(b"\x89PNG") if p.suffix == ".png" else b"<svg" in data


def test_save_demo_plots(tmp_path: Path) -> None:
    native, expandable = scene()[0], expandable_scene()
    names = [p.name for p in save_demo_plots(native, expandable, tmp_path)]
    assert names[:2] == ["side_by_side.png", "side_by_side.svg"]
    assert {"native_segment_map.png", "expandable_timeline.svg"} <= set(names) and len(names) == 10
    assert all((tmp_path / n).stat().st_size > 0 for n in names)


def test_the_plot_command_writes_pictures_and_refuses_bad_input(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["plot", str(FIXTURE), "-o", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} >= {"segment_map.png", "timeline.svg"}
    assert "segment_map.png" in capsys.readouterr().out
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps({"segments": "nope"}))
    assert cli_main(["plot", str(bad), "-o", str(tmp_path)]) == 2  # bad input: the command tree's exit rule
    assert "segments" in capsys.readouterr().err
    assert cli_main(["plot", str(tmp_path / "missing.pickle")]) == 2
    assert "missing.pickle" in capsys.readouterr().err


@needs_torch
def test_write_trace_plot_html_embeds_the_snapshot(tmp_path: Path) -> None:
    a, _ = scene()
    a.record_memory_history(True)
    a.free(a.malloc(1 * MiB))
    path = write_trace_plot_html(a, tmp_path / "trace.html")
    page = path.read_text()
    (payload,) = re.findall(r"const local_files = (.*)", page)
    data = pickle.loads(base64.b64decode(json.loads(payload)[0]["base64"]))
    assert data["segments"] == a.snapshot()["segments"]
    assert {e["action"] for e in data["device_traces"][0]} >= {"alloc", "free_requested", "segment_alloc"}
    assert 'id="minialloc-static"' in page and "data:image/png;base64," in page


def test_importing_minialloc_does_not_import_matplotlib() -> None:
    code = "import sys, minialloc; assert 'matplotlib' not in sys.modules, 'matplotlib was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_malformed_trace_inside_a_snapshot_is_named() -> None:
    snap = scene()[0].snapshot()
    snap["device_traces"][0][2]["size"] = "big"
    with pytest.raises(VizInputError, match=r"device_traces\[0\]\[2\]\.size"):
        plot_timeline(snap)
    assert by_gid(plot_segment_map(snap), "segment-")  # the map does not read the trace


def test_stepper_widget_redraws_on_the_slider() -> None:
    pytest.importorskip("ipywidgets")
    import ipywidgets as w

    stepper = Stepper([(4 * MiB, 0, "x"), (3 * MiB, 0, "y"), ("free", "x")], "")
    box = stepper.widget()
    controls, stats, image = box.children
    slider = next(c for c in controls.children if isinstance(c, w.IntSlider))
    before = image.value
    slider.value = 3
    assert bytes(image.value) != bytes(before) and bytes(image.value).startswith(b"\x89PNG")
    text = html.unescape(stats.value)
    assert "step 3 of 3: free 'x'" in text and "largest cached free block 13.00 MiB" in text
    assert stepper.replay.position == 3


def test_block_table_draws_one_arrow_per_table_entry_and_marks_shared_blocks() -> None:
    from matplotlib.patches import FancyArrowPatch

    from minialloc.paging import BlockManager
    from minialloc.viz import block_table_rows, plot_block_table
    from minialloc.viz.block_table import BLOCK_COLORS

    m = BlockManager(num_blocks=8, block_size=4)
    m.allocate(1, [11, 12, 13, 14, 15, 16])
    m.fork(1, 2)
    m.append_token(2, 99)  # copy-on-write of the shared, partly filled last block
    rows = block_table_rows(m)
    assert rows["seqs"] == [(1, [0, 1], [11, 12, 13, 14, 15, 16]), (2, [0, 2], [11, 12, 13, 14, 15, 16, 99])]
    assert rows["ref_cnt"][:3] == [2, 1, 1]
    fig = plot_block_table(m, title="fork")
    ax = fig.axes[0]
    assert len([p for p in ax.patches if isinstance(p, FancyArrowPatch)]) == 4
    pool = [p for p in ax.patches if isinstance(p, Rectangle) and abs(p.get_y() + p.get_height() / 2) < 1e-9]
    assert len(pool) == 8
    assert to_hex(pool[0].get_facecolor()) == BLOCK_COLORS["shared"].lower()
    assert to_hex(pool[2].get_facecolor()) == BLOCK_COLORS["owned"].lower()
    assert "11 12 13 14" in figure_texts(fig) and "15 16 99" in figure_texts(fig)


def test_labels_follow_the_notebook_language() -> None:
    from minialloc.lang import using
    from minialloc.viz import LABELS

    a, _ = scene()
    assert LABELS["live"] == "live block (allocated)"
    with using("de"):
        assert LABELS["live"] == "belegter Block (zugewiesen)"
        texts = figure_texts(plot_timeline(a))
        assert "reserviert" in texts and "Ereignisse im Trace" in texts
        assert "größter freier Block im Cache (umrandet)" in figure_texts(plot_segment_map(a))
    with using("vi"):
        fig = plot_side_by_side(a, a)
        assert any(t.startswith("phân đoạn mở rộng\n") for t in figure_texts(fig))  # the default panel titles
        assert "khối đang dùng (đã cấp phát)" in figure_texts(fig)


def _all_text(fig: Figure) -> str:
    from matplotlib.text import Text

    return "\n".join(t.get_text() for t in fig.findobj(Text))


def test_diagnosis_pictures_show_only_measured_figures_in_trace_entries() -> None:
    from minialloc.diagnose import diagnose, diagnosis_figures
    from minialloc.trace import read_device_trace
    from minialloc.viz._common import discard

    a = CachingAllocator(SimulatedGPU("1GiB"), "")
    held = [a.malloc(50 * MiB) for _ in range(3)]
    a.record_memory_history()
    for _ in range(3):
        a.free(a.malloc(20 * MiB))
    a.free(held[0])
    snap = a.snapshot()
    trace = read_device_trace(snap, 0)
    d = diagnose(trace, snap, replay_rows=False)  # no capacity: the simulated device stands for "no limit"
    figs = dict(diagnosis_figures(d, trace))
    assert "device free" not in _all_text(figs["segment_map"])
    ax = figs["timeline"].axes[0]
    assert ax.get_xlabel().startswith("trace entries")
    assert ax.get_xlim()[1] == len(trace.entries)  # one x step per trace entry, not per replay operation
    (mark,) = [line for line in ax.get_lines() if line.get_gid() == "mark"]
    assert mark.get_xdata()[0] == d.entry
    for fig in figs.values():
        discard(fig)
    capped = diagnose(trace, snap, capacity=1024 * MiB, replay_rows=False)
    figs = dict(diagnosis_figures(capped, trace))
    assert "device free" in _all_text(figs["segment_map"])
    for fig in figs.values():
        discard(fig)


def test_the_stepper_reads_a_trace_with_the_runs_max_split_size_as_replay_does() -> None:
    """Under max_split_size a malloc's release-and-retry frees oversize segments: minialloc.trace reads that as the
    malloc's own retry, not as an empty_cache() call. The stepper (Replay.from_snapshot, on a GPU too large to run
    out) gives back exactly those segments, as `minialloc replay` does, and ends where the run ended."""
    from minialloc.trace import MALLOC, RETRY_RELEASE, read_device_trace

    a = CachingAllocator(SimulatedGPU("600MiB"), "max_split_size_mb:100")
    a.record_memory_history()
    p, q = a.malloc(200 * MiB), a.malloc(200 * MiB)
    a.free(p)
    a.free(q)
    a.malloc(300 * MiB)  # no cached block may be split for it and the device has 200 MiB: release, then retry
    snap = a.snapshot()
    assert [op[0] for op in read_device_trace(snap).ops][-2:] == [RETRY_RELEASE, MALLOC]
    stepper = Replay.from_snapshot(snap)
    assert [op.kind for op in stepper.ops] == ["malloc", "malloc", "free", "free", "release", "malloc"]
    stepper.precompute()
    assert stepper.ooms == []
    end = stepper.goto(len(stepper))
    assert [s["total_size"] for s in end.snapshot()["segments"]] == [s["total_size"] for s in snap["segments"]]


def test_the_stepper_legend_names_only_kinds_its_replay_can_show():
    """Chapter 2's stepper (no second stream, no expandable segments) lists neither pending frees nor unmapped
    pages; the same trace with expandable segments adds unmapped pages."""
    from minialloc.viz._common import LABELS
    from minialloc.viz.stepper import Stepper
    from minialloc.workloads import CANONICAL_CAPACITY, canonical_scenario

    native = Stepper(canonical_scenario(), "", capacity=CANONICAL_CAPACITY)._stats_html()
    assert LABELS["live"] in native and LABELS["free_split"] in native
    assert LABELS["pending"] not in native and LABELS["unmapped"] not in native
    expandable = Stepper(canonical_scenario(), "expandable_segments:True", capacity=CANONICAL_CAPACITY)._stats_html()
    assert LABELS["unmapped"] in expandable


def test_a_stepper_can_hold_back_its_key_frames():
    """key_frames=False: a page without widgets shows the current step only, not the peak and the first OOM (a
    chapter holds those back until the learner has predicted them)."""
    from minialloc.viz.stepper import Stepper
    from minialloc.workloads import CANONICAL_CAPACITY, canonical_scenario

    def figures(stepper: Stepper) -> int:
        return stepper._repr_mimebundle_()["text/html"].count("<figure")

    assert figures(Stepper(canonical_scenario(), "", capacity=CANONICAL_CAPACITY)) == 3
    assert figures(Stepper(canonical_scenario(), "", capacity=CANONICAL_CAPACITY, key_frames=False)) == 1
