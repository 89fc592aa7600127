"""Diagnose a recorded run: what a person needs after an OOM, on one screen (and as JSON).

At one moment of the run (the first failure, else the peak of reserved memory, else a chosen trace entry) the
replay under the recorded settings, started from the state at the first trace entry (minialloc.replay) and
checked to land every allocation at its recorded address, rebuilds the allocator's exact state. From it:

- reserved and allocated memory, the cached free bytes (reserved but unallocated) and, at a failure, how many of
  them are unusable (in blocks too small for the failed request; without a failed request nothing is measured as
  unusable); and the largest CACHED free block (the segment map's meaning; the OOM message's "largest free block"
  also counts what the device can still give);
- the live memory grouped by the top user frame that allocated it (the innermost frame of the program's own
  Python code, from the trace's stacks: record with `_record_memory_history(stacks="python")` or "all"),
  largest first, with how many segments each group pins;
- the segments that are mostly free but pinned by a few (at most 4) live blocks, and who pinned them: what
  fragmentation looks like from the program's side (none of those segments can go back to the device);
- the replay verdict (minialloc.replay.verdict).

A snapshot whose trace cannot be replayed (none, one too short, another allocator's) is read as it is
(diagnose_state): the same holders, pinned segments and per-pool figures, from the final state, and one line on
why no what-if is possible and what to record next time.

The replay is checked as it runs: when an allocation leaves its recorded address (the snapshot's settings, or
the model, do not match the run), the report says so at its top, since its figures then describe another run.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .allocator import CachingAllocator
from .lang import messages, say
from .replay import DEFAULT_WHAT_IF, ReplayResult, check_capacity, replay_trace, verdict, what_if_trace
from .sizes import readable_size
from .trace import DeviceTrace, TraceError, recorded_config, top_user_frame

# The report as a person reads it, in the notebook's (or MINIALLOC_LANG's) language: minialloc.lang. as_dict (the
# JSON) keeps English, the two holder names above included.
TEXT = messages("minialloc.diagnose.TEXT", {
    "before_recording": "(allocated before the trace began, no stack)",
    # a live block of the replay at an address where the run had none: only once the replay has left the run
    "off_the_run": "(placed where the run had no block: the replay diverged before it)",
    # the names trace.top_user_frame gives blocks without a frame of the program's own
    "no_stack": "(no stack recorded)",
    "no_python_frame": "(no Python frame)",
    "grad_tensors": "(the .grad tensors)",
    "autograd_engine": "backward: autograd engine",
    "warning_diverges": "warning: the replay diverges from the run at trace entry {entry} (see minialloc replay "
                        "--check): the figures below are unreliable",
    "snapshot_state": "device {device}, the state the snapshot holds",
    "at_failure": "at the first failure",
    "at_peak": "at the peak of reserved memory",
    "at_entry": "at the chosen entry",
    "moment": "device {device}, {where}: before trace entry {entry}",
    "request": " (a request of {size})",
    "on_device": ", on a device of {size}",
    "cached_free": "cached free {size}",
    "cached_free_unusable": "cached free {size}, of it unusable for the request {unusable}",
    "totals": "  reserved {reserved} · allocated {allocated} · {free}",
    "largest": "  largest cached free block {size}",
    "largest_oom": " (counting the device's free memory too, as the OOM message does: {size})",
    "pool": "  {pool} pool: {segments}, {reserved} reserved, {free} cached free (largest {largest}, fragmentation "
            "{fragmentation})",
    "pool_default": "default {kind}",
    "pool_private": "private {id} {kind}",
    "large": "large",
    "small": "small",
    "who_holds": "who holds the memory (live blocks by the top user frame that allocated them):",
    "more_places": "in {n} more places",
    "pinned": "segments mostly free but pinned by at most {n} live blocks (cannot go back to the device):",
    "none": "  none",
    "pinned_row": "  {address}  {size:>10}, {free:>10} free, {live} live: {holders}",
    "pinned_more": "  ... and {n} more, {free} free in them",
    "no_replay": "no replay: {why}",
    "verdict": "verdict: {line}",
    "block_one": "{n} block",
    "block_many": "{n} blocks",
    "segment_one": "{n} segment",
    "segment_many": "{n} segments",
})
BEFORE_RECORDING = TEXT["before_recording"].english  # the holders' names in the JSON
OFF_THE_RUN = TEXT["off_the_run"].english


_MADE_UP_NAMES = ("before_recording", "off_the_run", "no_stack", "no_python_frame", "grad_tensors", "autograd_engine")


def holder_name(frame: str) -> str:
    """A holder's name as shown: the names minialloc makes up translated, a frame of the program as it is."""
    for key in _MADE_UP_NAMES:
        frame = frame.replace(TEXT[key].english, say(TEXT, key))
    return frame


def _pool_name(pool: str) -> str:
    """pool_states' English name ("default large", "private (1, 2) small") in the notebook's language."""
    owner, _, kind = pool.rpartition(" ")
    shown_kind = say(TEXT, kind) if kind in ("large", "small") else kind
    if owner == "default":
        return say(TEXT, "pool_default", kind=shown_kind)
    if owner.startswith("private "):
        return say(TEXT, "pool_private", id=owner.removeprefix("private "), kind=shown_kind)
    return pool


@dataclass
class Holder:
    """Live memory allocated from one place in the program."""

    frame: str
    bytes: int = 0
    blocks: int = 0
    segments: int = 0


@dataclass
class PinnedSegment:
    address: int
    size: int
    free: int
    live_blocks: int
    holders: list[str] = field(default_factory=list)


@dataclass
class PoolState:
    """One pool's cached memory: a private pool (segment_pool_id other than (0, 0)) and its small or large
    segments. fragmentation is 1 - largest free block / free bytes (TensorFlow's BFC and RMM report it so)."""

    pool: str
    segments: int = 0
    reserved: int = 0
    allocated: int = 0
    cached_free: int = 0
    largest_free_block: int = 0

    @property
    def fragmentation(self) -> float:
        return 1 - self.largest_free_block / self.cached_free if self.cached_free else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fragmentation": round(self.fragmentation, 4)}


def pool_states(segments: list[dict]) -> list[PoolState]:
    """Per pool and segment type, from snapshot-schema segments; the default pool first."""
    pools: dict[tuple, PoolState] = {}
    for seg in segments:
        pool_id = tuple(seg.get("segment_pool_id", (0, 0)))
        kind = seg.get("segment_type", "large")
        name = f"{'default' if pool_id == (0, 0) else 'private ' + str(pool_id)} {kind}"
        p = pools.setdefault((pool_id != (0, 0), pool_id, kind), PoolState(name))
        p.segments += 1
        p.reserved += seg["total_size"]
        for b in seg["blocks"]:
            if b["state"] == "inactive":
                p.cached_free += b["size"]
                p.largest_free_block = max(p.largest_free_block, b["size"])
            else:
                p.allocated += b["size"]
    return [pools[k] for k in sorted(pools)]


@dataclass
class Diagnosis:
    device: int
    moment: str  # "failure", "peak", "entry", or "snapshot" (the file's own state: no replay)
    entry: int  # the trace entry the state is taken before
    capacity: int | None
    reserved: int = 0
    allocated: int = 0
    cached_free: int = 0  # reserved but unallocated
    unusable: int | None = None  # of cached_free, in blocks smaller than the failed request (moment "failure")
    largest_cached_free_block: int = 0  # cached only: the device's free memory is not counted
    # at a failure, the OOM message's "largest free block": the larger of the cached one and the device's free
    oom_largest_free_block: int | None = None
    request: int = 0  # the failed request's size (moment "failure")
    diverged_at: int | None = None  # the trace entry where the replay left the run (figures unreliable)
    holders: list[Holder] = field(default_factory=list)
    pinned: list[PinnedSegment] = field(default_factory=list)
    pools: list[PoolState] = field(default_factory=list)
    no_replay: str = ""  # moment "snapshot": why the trace could not be replayed, and what to record next time
    verdict: str = ""
    rows: list[ReplayResult] = field(default_factory=list, repr=False)
    allocator: CachingAllocator | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("allocator", "rows")}
        d["holders"] = [asdict(h) for h in self.holders]
        d["pinned"] = [asdict(p) for p in self.pinned]
        d["pools"] = [p.as_dict() for p in self.pools]
        d["rows"] = [r.as_dict() for r in self.rows]
        return d

    def text(self, top: int = 8, width: int = 110) -> str:
        size = readable_size
        lines = []
        if self.diverged_at is not None:
            lines.append(say(TEXT, "warning_diverges", entry=self.diverged_at))
        if self.moment == "snapshot":
            lines.append(say(TEXT, "snapshot_state", device=self.device))
        else:
            where = say(TEXT, {"failure": "at_failure", "peak": "at_peak", "entry": "at_entry"}[self.moment])
            lines.append(say(TEXT, "moment", device=self.device, where=where, entry=self.entry)
                         + (say(TEXT, "request", size=size(self.request)) if self.request else ""))
        if self.capacity is not None:
            lines[-1] += say(TEXT, "on_device", size=size(self.capacity))
        free = (say(TEXT, "cached_free_unusable", size=size(self.cached_free), unusable=size(self.unusable))
                if self.unusable is not None else say(TEXT, "cached_free", size=size(self.cached_free)))
        lines += [
            say(TEXT, "totals", reserved=size(self.reserved), allocated=size(self.allocated), free=free),
            say(TEXT, "largest", size=size(self.largest_cached_free_block))
            + ("" if self.oom_largest_free_block is None else
               say(TEXT, "largest_oom", size=size(self.oom_largest_free_block))),
        ]
        for p in self.pools:
            lines.append(say(TEXT, "pool", pool=_pool_name(p.pool), segments=_count(p.segments, "segment"),
                             reserved=size(p.reserved), free=size(p.cached_free), largest=size(p.largest_free_block),
                             fragmentation=f"{p.fragmentation:.0%}"))
        lines += ["", say(TEXT, "who_holds")]
        for h in self.holders[:top]:
            lines.append(f"  {size(h.bytes):>11}  {_count(h.blocks, 'block'):>11}  {_count(h.segments, 'segment'):>12}"
                         f"  {holder_name(h.frame)}")
        if len(self.holders) > top:
            rest = self.holders[top:]
            lines.append(f"  {size(sum(h.bytes for h in rest)):>11}  "
                         f"{_count(sum(h.blocks for h in rest), 'block'):>11}  {'':>12}  "
                         + say(TEXT, "more_places", n=len(rest)))
        lines += ["", say(TEXT, "pinned", n=PINNED_MAX_LIVE)]
        if not self.pinned:
            lines.append(say(TEXT, "none"))
        for p in self.pinned[:top]:
            lines.append(say(TEXT, "pinned_row", address=f"{p.address:#x}", size=size(p.size), free=size(p.free),
                             live=p.live_blocks, holders=", ".join(holder_name(h) for h in p.holders)))
        if len(self.pinned) > top:
            lines.append(say(TEXT, "pinned_more", n=len(self.pinned) - top,
                             free=size(sum(p.free for p in self.pinned[top:]))))
        if self.no_replay:
            lines += ["", say(TEXT, "no_replay", why=self.no_replay)]  # one line, whole: what to do next time
        if self.verdict:
            # one short line each (the verdict's own lines are long sentences): wrapped for a terminal
            lines.append("")
            for k, line in enumerate(self.verdict.splitlines()):
                lines += textwrap.wrap(say(TEXT, "verdict", line=line) if k == 0 else line, width,
                                       subsequent_indent="  ", break_on_hyphens=False)
        return "\n".join(lines)


PINNED_MAX_LIVE = 4  # "a few" live blocks: a segment crowded with more is in use, not pinned


def _count(n: int, word: str) -> str:
    """"1 block", "3 blocks" (or "segment"), in the notebook's language."""
    return say(TEXT, f"{word}_one" if n == 1 else f"{word}_many", n=n)


def _check_at(trace: DeviceTrace, at: int) -> None:
    n = len(trace.entries)
    if not 0 <= at <= n:  # n itself: the state after the last entry
        raise TraceError(f"--at {at}: device {trace.device}'s trace has entries 0 to {n - 1}; --at takes 0 "
                         f"to {n} (the state before that entry; {n}: after the last one)")


def _moment(trace: DeviceTrace, result: ReplayResult, at: int | None) -> tuple[str, int, int, int | None]:
    """(moment, trace entry, request size, the OOM message's largest free block at a failure): the state is
    taken before that entry's operation. result: the whole run's replay under the recorded settings, with its
    samples when `at` is None."""
    if at is not None:
        return "entry", at, 0, None
    if result.first_failure_entry is not None:
        return "failure", result.first_failure_entry, result.first_failure_size, result.largest_free_at_failure
    # the first operation after which reserved, then allocated, is highest; the state is taken after it
    best = max(range(len(result.samples)), key=lambda k: (result.samples[k][1], result.samples[k][0], -k),
               default=-1)
    ops = trace.ops
    entry = ops[best + 1][1] if best + 1 < len(ops) else len(trace.entries)
    return "peak", entry, 0, None


def diagnose(trace: DeviceTrace, snapshot: dict, *, capacity: int | None = None, at: int | None = None,
             configs: tuple[str, ...] = DEFAULT_WHAT_IF, replay_rows: bool = True,
             pinned_free_fraction: float = 0.5, relaid: bool | None = None) -> Diagnosis:
    """The report for one device (see the module docstring). capacity None: from an 'oom' entry, else none."""
    check_capacity(capacity)
    config = recorded_config(snapshot)
    if capacity is None:
        capacity = trace.capacity_at_oom()
    if at is not None:
        _check_at(trace, at)  # before any replay: a bad --at is bad usage, whatever the capacity
    # the whole run, under the recorded settings, replayed once: where it leaves the recorded addresses (if it
    # does) and, without --at, the moment to look at
    whole, _ = replay_trace(trace, config, capacity, at_recorded=True, keep_samples=at is None)
    moment, entry, request, oom_largest = _moment(trace, whole, at)
    _, a = replay_trace(trace, config, capacity, at_recorded=True, until=entry)
    d = Diagnosis(trace.device, moment, entry, capacity, request=request, allocator=a, diverged_at=whole.diverged_at)
    d.reserved, d.allocated = a.memory_reserved(), a.memory_allocated()
    d.cached_free = d.reserved - d.allocated
    d.largest_cached_free_block = a.largest_free_block()
    d.oom_largest_free_block = oom_largest
    if moment == "failure":
        d.unusable = 0

    frames = _frames_of_live_blocks(trace, entry)

    def name_of(block: dict) -> str:
        if block["address"] not in frames:
            return OFF_THE_RUN
        got = frames[block["address"]]
        return BEFORE_RECORDING if got is None else top_user_frame(got)

    _read_state(d, a.snapshot()["segments"], name_of, pinned_free_fraction)
    if replay_rows:
        d.rows = what_if_trace(trace, config, configs, capacity, relaid=relaid)
        d.verdict = verdict(d.rows, capacity, trace.reserved_at_start)
    return d


def diagnose_state(snapshot: dict, device: int, why: str, pinned_free_fraction: float = 0.5) -> Diagnosis:
    """The report for a device whose trace cannot be replayed (why: trace.why_not_replayable's line): the
    state the snapshot holds, read as it is. Blocks carry the stack of their allocation when history was on."""
    segments = [s for s in snapshot.get("segments", []) if int(s.get("device", 0)) == device]
    d = Diagnosis(device, "snapshot", len(_device_trace(snapshot, device)), None, no_replay=why)
    _read_state(d, segments, lambda b: top_user_frame(b.get("frames")), pinned_free_fraction)
    d.reserved = sum(s["total_size"] for s in segments)
    d.allocated = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] != "inactive")
    d.cached_free = d.reserved - d.allocated
    d.largest_cached_free_block = max((p.largest_free_block for p in d.pools), default=0)
    return d


def _device_trace(snapshot: dict, device: int) -> list:
    traces = snapshot.get("device_traces") or []
    return traces[device] if 0 <= device < len(traces) else []


def _read_state(d: Diagnosis, segments: list[dict], name_of: Any, pinned_free_fraction: float) -> None:
    """Holders, pinned segments, pools (and the unusable bytes at a failure) from snapshot-schema segments."""
    groups: dict[str, Holder] = {}
    seg_sets: dict[str, set[int]] = defaultdict(set)
    for seg in segments:
        free = sum(b["size"] for b in seg["blocks"] if b["state"] == "inactive")
        if d.unusable is not None:
            d.unusable += sum(b["size"] for b in seg["blocks"] if b["state"] == "inactive" and b["size"] < d.request)
        live = [b for b in seg["blocks"] if b["state"] != "inactive"]
        names = []
        for b in live:
            name = name_of(b)
            h = groups.setdefault(name, Holder(name))
            h.bytes += b["size"]
            h.blocks += 1
            seg_sets[name].add(seg["address"])
            names.append(name)
        if live and len(live) <= PINNED_MAX_LIVE and free >= pinned_free_fraction * seg["total_size"]:
            counts: dict[str, int] = defaultdict(int)
            for n in names:
                counts[n] += 1
            who = [f"{n} x{c}" if c > 1 else n for n, c in sorted(counts.items(), key=lambda t: -t[1])[:2]]
            d.pinned.append(PinnedSegment(seg["address"], seg["total_size"], free, len(live), who))
    for name, h in groups.items():
        h.segments = len(seg_sets[name])
    d.holders = sorted(groups.values(), key=lambda h: (-h.bytes, h.frame))
    d.pinned.sort(key=lambda p: (-p.free, p.address))
    d.pools = pool_states(segments)


def _frames_of_live_blocks(trace: DeviceTrace, entry: int) -> dict[int, list | None]:
    """address -> frames of the allocation that made the block live there before `entry` (the replay under the
    recorded settings puts every block at its recorded address, so the trace's own alloc entries name them)."""
    frames: dict[int, list | None] = {b["address"]: b["frames"] or None for s in trace.start_segments
                                      for b in s["blocks"] if b["state"] == "active_allocated"}
    for e in trace.entries[:entry]:
        if e.get("action") == "alloc":
            frames[e["addr"]] = e.get("frames") or []
    return frames


def save_diagnosis_plots(d: Diagnosis, trace: DeviceTrace, out_dir: str | Path, config: str) -> list[Path]:
    """The segment map at the diagnosed moment and the run's timeline, as PNG and SVG.

    Only measured figures go on them: the device's free memory is shown when there is a capacity (without one
    the simulated device is a stand-in for "no limit", whose free memory means nothing), and the timeline is the
    recorded run in trace entries, with the diagnosed entry marked, so "before trace entry N" can be found on it."""
    from .viz._common import discard

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in diagnosis_figures(d, trace):
        for fmt in ("png", "svg"):
            path = out / f"device{d.device}_{name}.{fmt}"
            fig.savefig(path, format=fmt, dpi=110)
            paths.append(path)
        discard(fig)
    return paths


def diagnosis_figures(d: Diagnosis, trace: DeviceTrace) -> list[tuple[str, Any]]:
    """(name, matplotlib Figure) of the segment map at the diagnosed moment and the recorded run's timeline."""
    from .viz import plot_segment_map, plot_timeline
    from .viz._common import Source
    from .viz.timeline import device_trace_timeline

    assert d.allocator is not None
    a = d.allocator
    free = None if d.capacity is None else max(0, d.capacity - a.memory_reserved())
    source = Source(a.snapshot(), a, free, d.capacity,
                    [(seg.ptr, seg.size) for seg in getattr(a, "expandable_segments", [])])
    title = f"device {d.device} before trace entry {d.entry} ({d.moment})"
    timeline = device_trace_timeline(trace, d.capacity)
    mark = (d.entry, f"diagnosed: before entry {d.entry} ({d.moment})")
    return [("segment_map", plot_segment_map(source, title=title)),
            ("timeline", plot_timeline(timeline, capacity=d.capacity, mark=mark,
                                       title=f"device {d.device}: the recorded run"))]
