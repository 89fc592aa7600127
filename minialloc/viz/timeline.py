"""The timeline: allocated and reserved memory after every event of a trace, against the device's capacity.

The curves come from replaying a snapshot's device_traces, one entry at a time:

- alloc adds the entry's size to allocated. PyTorch (and minialloc) record the REQUESTED size there, before
  rounding to 512 bytes or to a whole block, so this curve is the bytes the program asked for: it can sit a
  little under memory_allocated(), which counts whole blocks. The size is used as given.
- free_requested takes the allocation's size off allocated (memory_allocated() drops at free(), even when the
  block waits on another stream); a free_completed only counts when no free_requested came for that address
  (traces that record one kind of free only).
- segment_alloc and segment_map add to reserved; segment_free and segment_unmap take off.
- oom is marked (red line); so are release bursts, runs of segment_free/segment_unmap with no allocation
  between them, as empty_cache and the OOM retry path make: two or more releases, or one of at least a quarter
  of what was reserved (green band).

A ring buffer keeps only the newest entries, so a trace may begin mid-run and free what it never saw
allocated. Then, if a snapshot is at hand, both curves start from the state at the first trace entry, rebuilt
from the snapshot by minialloc.trace (the reader `minialloc replay` uses); if that state cannot be rebuilt they
are anchored to the snapshot's end state; without a snapshot they are lifted so their lowest point is 0, and
the figure says they are lower bounds.

Explicit samples, a list of (allocated, reserved) pairs, are drawn as they are, one x step per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ..lang import messages
from ..sizes import format_size
from ._common import (
    ALLOCATED_COLOR,
    OOM_COLOR,
    RELEASE_COLOR,
    RESERVED_COLOR,
    VizInputError,
    choose_unit,
    hide_spines,
    new_figure,
    nothing_figure,
    resolve,
    say,
    titled,
)

_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
            "segment_unmap", "snapshot", "oom")
_NEUTRAL = ("free_requested", "free_completed", "snapshot")  # do not end a release burst

# Every word the timeline writes, in English, shown in the notebook's language (minialloc.lang) when it is drawn.
TEXT = messages("minialloc.viz.timeline.TEXT", {
    "nothing": "no trace events: nothing to plot",
    "nothing_detail":
        "Record them before the run with allocator.record_memory_history() "
        "(torch.cuda.memory._record_memory_history() in PyTorch).",
    "note_start":
        "trace starts mid-run, with {reserved} reserved: curves start from the state at its first entry, "
        "rebuilt from the snapshot",
    "note_end": "trace starts mid-run (ring buffer full?): curves anchored to the snapshot's end state",
    "note_lifted": "trace starts mid-run: curves lifted to start at 0, so they are lower bounds",
    "reserved": "reserved",
    "allocated": "allocated",
    "allocated_requested": "allocated (requested bytes)",
    "capacity": "device capacity",
    "ooms": "out of memory ({n})",
    "oom_limit": "reserved + device free at OOM",
    "oom_label": "OOM: {size}",
    "release": "release burst (empty_cache-like)",
    "released": "released {size}",
    "samples": "samples",
    "events": "trace entries (device_traces index)",
    "memory": "memory ({unit})",
    "head": "peak allocated {allocated} · peak reserved {reserved}",
    "head_oom": " · {n} OOM",
    "head_ooms": " · {n} OOMs",
    "head_capacity": " · device capacity {size} (off the scale)",
})


@dataclass
class Timeline:
    """allocated[k] and reserved[k]: bytes after the first k events (k = 0 is before the first)."""

    allocated: np.ndarray
    reserved: np.ndarray
    ooms: list[tuple[int, int, int | None]] = field(default_factory=list)  # (k, size, device_free)
    releases: list[tuple[int, int, int]] = field(default_factory=list)  # (k0, k1, bytes): events k0+1..k1
    capacity: int | None = None
    note: str = ""
    samples: bool = False  # True: explicit (allocated, reserved) samples, not a trace

    @property
    def events(self) -> int:
        return max(0, len(self.allocated) - (0 if self.samples else 1))


def _check_entry(entry: Any, where: str) -> None:
    if not isinstance(entry, dict):
        raise VizInputError(f"{where}: expected a trace entry dict, got {type(entry).__name__}")
    action = entry.get("action")
    if action not in _ACTIONS:
        raise VizInputError(f"{where}.action: expected one of {', '.join(_ACTIONS)}, got {action!r}")
    keys = ("size", "device_free") if action == "oom" else ("size", "addr")
    for key in keys:
        value = entry.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise VizInputError(f"{where}.{key}: expected an int, got {value!r}")


def _samples(items: Sequence[Any], capacity: int | None) -> Timeline:
    values = []
    for i, item in enumerate(items):
        ok = isinstance(item, (tuple, list)) and len(item) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in item
        )
        if not ok:
            raise VizInputError(f"samples[{i}]: expected an (allocated, reserved) pair of byte counts, "
                                f"got {item!r}")
        values.append(item)
    arr = np.asarray(values, dtype=np.float64).reshape(-1, 2)
    return Timeline(arr[:, 0], arr[:, 1], capacity=capacity, samples=True)


def timeline_data(source: Any, *, device: int = 0, capacity: int | None = None) -> Timeline:
    """Replay a trace into curves. source: a snapshot dict, an allocator, a snapshot pickle's path, a list of
    trace entries (dicts), or a list of (allocated, reserved) samples."""
    snapshot: dict[str, Any] | None = None
    if isinstance(source, (list, tuple)):
        if source and not isinstance(source[0], dict):
            return _samples(source, capacity)
        trace = list(source)
        for i, entry in enumerate(trace):
            _check_entry(entry, f"trace[{i}]")
    else:
        src = resolve(source)
        snapshot = src.snapshot
        capacity = src.capacity if capacity is None else capacity
        traces = snapshot.get("device_traces", [])
        if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
            raise VizInputError("device_traces: expected a list of lists of trace entries (one per device)")
        trace = traces[device] if 0 <= device < len(traces) else []
        for i, entry in enumerate(trace):
            _check_entry(entry, f"device_traces[{device}][{i}]")
    return _replay(trace, snapshot, device, capacity)


def _replay(trace: list[dict[str, Any]], snapshot: dict[str, Any] | None, device: int,
            capacity: int | None) -> Timeline:
    n = len(trace)
    allocated = np.zeros(n + 1, dtype=np.int64)
    reserved = np.zeros(n + 1, dtype=np.int64)
    live: dict[int, int] = {}  # addr -> size added at alloc
    requested: set[int] = set()  # addresses whose free_requested was counted
    truncated = False
    ooms: list[tuple[int, int, int | None]] = []
    releases: list[tuple[int, int, int]] = []
    run: list[int] | None = None  # [k0, k1, bytes, count] of the release run in progress
    a = r = 0
    for i, e in enumerate(trace):
        action = e["action"]
        size = e["size"]
        if action == "alloc":
            live[e["addr"]] = size
            a += size
        elif action == "free_requested":
            got = live.pop(e["addr"], None)
            truncated |= got is None
            a -= size if got is None else got
            requested.add(e["addr"])
        elif action == "free_completed":
            if e["addr"] in requested:
                requested.discard(e["addr"])
            elif e["addr"] in live:
                a -= live.pop(e["addr"])
        elif action in ("segment_alloc", "segment_map"):
            r += size
        elif action in ("segment_free", "segment_unmap"):
            if run is None:
                run = [i, i + 1, 0, 0, r]
            run[1], run[2], run[3] = i + 1, run[2] + size, run[3] + 1
            r -= size
        elif action == "oom":
            ooms.append((i + 1, size, e.get("device_free")))
        if run is not None and action not in _NEUTRAL and action not in ("segment_free", "segment_unmap"):
            _close_run(run, releases)
            run = None
        allocated[i + 1] = a
        reserved[i + 1] = r
    if run is not None:
        _close_run(run, releases)

    note = ""
    # a snapshot says what was held before the first entry, even when the trace never frees any of it
    start = _start_state(snapshot, device) if n and snapshot is not None else None
    if start is not None and (start[0] or start[1]):
        allocated += start[0]
        reserved += start[1]
        note = say(TEXT, "note_start", reserved=format_size(start[1]))
    elif n and (truncated or allocated.min() < 0 or reserved.min() < 0):
        end = _end_state(snapshot, device) if snapshot is not None and start is None else None
        if end is not None:
            allocated += end[0] - allocated[-1]
            reserved += end[1] - reserved[-1]
            note = say(TEXT, "note_end")
        else:
            allocated -= min(0, int(allocated.min()))
            reserved -= min(0, int(reserved.min()))
            note = say(TEXT, "note_lifted")
    return Timeline(allocated, reserved, ooms, releases, capacity, note)


def _close_run(run: list[int], releases: list[tuple[int, int, int]]) -> None:
    k0, k1, nbytes, count, reserved_before = run
    if count >= 2 or nbytes * 4 >= reserved_before:
        releases.append((k0, k1, nbytes))


def _start_state(snapshot: dict[str, Any], device: int) -> tuple[int, int] | None:
    """(requested bytes live, reserved bytes) at the first trace entry, or None if it cannot be rebuilt."""
    from ..trace import TraceError, read_device_trace

    try:
        trace = read_device_trace(snapshot, device)
    except (TraceError, KeyError, TypeError, ValueError):
        return None
    return sum(trace.live_at_start.values()), trace.reserved_at_start


def _end_state(snapshot: dict[str, Any], device: int) -> tuple[int, int] | None:
    segments = [s for s in snapshot.get("segments", []) if s.get("device", device) == device]
    if not segments:
        return None
    # requested sizes, as the trace's alloc entries carry; the block size where a writer left it out
    allocated = sum(b.get("requested_size") or b["size"] for s in segments for b in s["blocks"]
                    if b["state"] == "active_allocated")
    return allocated, sum(s["total_size"] for s in segments)


def device_trace_timeline(trace: Any, capacity: int | None = None) -> Timeline:
    """The recorded run's curves for a read device trace (minialloc.trace.DeviceTrace), x in trace entries,
    starting from the state at its first entry as the trace reader found it (no second rebuild)."""
    for i, entry in enumerate(trace.entries):
        _check_entry(entry, f"device_traces[{trace.device}][{i}]")
    tl = _replay(list(trace.entries), None, trace.device, capacity)
    # without a snapshot _replay lifts curves that dip below 0 by a constant: the known start replaces that
    tl.allocated = tl.allocated - tl.allocated[0] + trace.recorded_live_at_start[1]
    tl.reserved = tl.reserved - tl.reserved[0] + trace.recorded_reserved_at_start
    start = trace.recorded_reserved_at_start
    tl.note = say(TEXT, "note_start", reserved=format_size(start)) if start else ""
    return tl


def plot_timeline(
    source: Any, *, device: int = 0, capacity: int | None = None, title: str | None = None,
    mark: tuple[int, str] | None = None,
) -> Figure:
    """Allocated and reserved memory across a trace (or samples), with capacity, OOMs and release bursts.
    mark: (x, label) of a moment to draw as a vertical line (a diagnosis's trace entry)."""
    tl = source if isinstance(source, Timeline) else timeline_data(source, device=device, capacity=capacity)
    if capacity is not None:
        tl.capacity = capacity
    if len(tl.allocated) == 0 or (not tl.samples and tl.events == 0):
        return nothing_figure(say(TEXT, "nothing"), say(TEXT, "nothing_detail"))

    fig = new_figure(11, 4.2)
    ax = fig.add_axes((0.08, 0.14, 0.9, 0.7))
    top = float(max(tl.reserved.max(), tl.allocated.max(), 1))
    on_scale = tl.capacity is not None and tl.capacity <= 20 * top
    unit, unit_name = choose_unit(max(top, tl.capacity) if on_scale and tl.capacity else top)
    x = np.arange(len(tl.allocated))
    ax.plot(x, tl.reserved / unit, drawstyle="steps-post", color=RESERVED_COLOR, linewidth=1.6,
            label=say(TEXT, "reserved"))
    ax.plot(x, tl.allocated / unit, drawstyle="steps-post", color=ALLOCATED_COLOR, linewidth=1.6,
            label=say(TEXT, "allocated" if tl.samples else "allocated_requested"))
    if tl.capacity is not None and on_scale:
        ax.axhline(tl.capacity / unit, color="black", linestyle="--", linewidth=1, label=say(TEXT, "capacity"))
    if tl.ooms:
        ks = [k for k, _, _ in tl.ooms]
        ax.vlines(ks, 0, 1, transform=ax.get_xaxis_transform(), colors=OOM_COLOR, linewidth=1.2,
                  label=say(TEXT, "ooms", n=len(ks)), gid="ooms")
        # what the device could have held at the OOM; off the scale when other processes hold the rest
        limits = [(k, tl.reserved[k] + free) for k, _, free in tl.ooms if free is not None and
                  tl.reserved[k] + free <= 20 * top]
        if limits:
            ax.plot([k for k, _ in limits], [v / unit for _, v in limits], "v", color=OOM_COLOR, markersize=5,
                    label=say(TEXT, "oom_limit"))
        span = max(len(x) - 1, 1)
        labelled: list[int] = []
        for k, size, _ in tl.ooms:
            if len(labelled) == 3 or (labelled and k - labelled[-1] < 0.12 * span):
                continue  # labels closer than that would overlap; the legend has the count
            left = k > 0.8 * span  # near the right edge the label goes to the left of its line
            ax.annotate(say(TEXT, "oom_label", size=format_size(size)), xy=(k, 1), xycoords=("data", "axes fraction"),
                        xytext=(-3 if left else 3, -3), textcoords="offset points", va="top",
                        ha="right" if left else "left", fontsize=7.5, color=OOM_COLOR)
            labelled.append(k)
    if tl.releases:
        mask = np.zeros(len(x), dtype=bool)
        for k0, k1, _ in tl.releases:
            mask[k0:k1 + 1] = True
        ax.fill_between(x, 0, 1, where=mask, transform=ax.get_xaxis_transform(), color=RELEASE_COLOR,
                        alpha=0.25, linewidth=0, step="post", label=say(TEXT, "release"),
                        gid="releases")
        for k0, k1, nbytes in sorted(tl.releases, key=lambda t: -t[2])[:3]:
            ax.annotate(say(TEXT, "released", size=format_size(nbytes)), xy=((k0 + k1) / 2, 0.02),
                        xycoords=("data", "axes fraction"), ha="center", fontsize=7, color="#005F46")
    if mark is not None:
        ax.axvline(mark[0], color="black", linestyle=":", linewidth=1.2, label=mark[1], gid="mark")
    ax.set_xlim(0, max(len(x) - 1, 1))
    ax.set_ylim(0, top / unit * 1.12 if not on_scale else max(top, tl.capacity or 0) / unit * 1.08)
    ax.set_xlabel(say(TEXT, "samples" if tl.samples else "events"), fontsize=9)
    ax.set_ylabel(say(TEXT, "memory", unit=unit_name), fontsize=9)
    ax.tick_params(labelsize=8)
    ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
    hide_spines(ax, "top", "right")
    head = say(TEXT, "head", allocated=format_size(int(tl.allocated.max())),
               reserved=format_size(int(tl.reserved.max())))
    if tl.ooms:
        head += say(TEXT, "head_ooms" if len(tl.ooms) > 1 else "head_oom", n=len(tl.ooms))
    if tl.capacity is not None and not on_scale:
        head += say(TEXT, "head_capacity", size=format_size(tl.capacity))
    ax.set_title(titled(head, title), fontsize=10)
    if tl.note:
        fig.text(0.08, 0.015, tl.note, fontsize=8, color="#555555", gid="timeline-note")
    return fig
