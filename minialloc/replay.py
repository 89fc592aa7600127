"""Replay: run a recorded allocation trace through the allocator under other settings ("what if?").

The engineer's question after an OOM is "would expandable_segments, or max_split_size_mb:N, have saved my
run?". A trace answers it: replay the same mallocs and frees on a simulated GPU of the same size under each
config and compare peak reserved memory and OOMs. This is the model of RMM's REPLAY benchmark, which replays a
logging_resource_adaptor CSV against a chosen memory resource.

Inputs (read_trace):
- a PyTorch snapshot pickle (torch.cuda.memory._dump_snapshot) or a minialloc one: its device_traces;
- an RMM log CSV with the columns Thread,Time,Action,Pointer,Size,Stream.
A trace becomes a list of workloads.Event, so a generated workload replays the same way.

From a snapshot trace: 'alloc' entries allocate their requested size; a block is freed at 'free_completed'
(when PyTorch could reuse it; 'free_requested' when the trace has no completion); an 'oom' entry is the request
that failed, tried again; a run of segment_free / segment_unmap entries that is not part of a malloc is an
empty_cache() call (see _is_empty_cache). So a replay of a minialloc snapshot under the run's own config and
capacity reproduces its peak reserved exactly.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .allocator import CachingAllocator
from .device import SimulatedGPU
from .oom import OutOfMemoryError
from .snapshot import SnapshotError, load_snapshot
from .workloads import Event


class TraceError(ValueError):
    """A trace that cannot be replayed: the message names the file and the event index."""


@dataclass
class ReplayResult:
    config: str
    peak_allocated: int = 0
    peak_reserved: int = 0
    ooms: int = 0
    retries: int = 0
    first_failure: int | None = None  # index of the first event that raised OutOfMemoryError
    first_failure_label: str = ""
    first_failure_message: str = ""
    events: int = 0
    samples: list[tuple[int, int]] = field(default_factory=list, repr=False)  # (allocated, reserved) per event

    @property
    def efficiency(self) -> float:
        """Peak allocated / peak reserved: 1.0 means no byte was held that the program did not use."""
        return self.peak_allocated / self.peak_reserved if self.peak_reserved else 1.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("samples")
        d["efficiency"] = round(self.efficiency, 4)
        return d


def replay(
    events: Sequence[Event],
    allocator: CachingAllocator,
    source: str = "<trace>",
    keep_samples: bool = False,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Run `events` through `allocator`. An OOM is counted and the allocation skipped; the replay goes on."""
    result = ReplayResult(config=allocator.config.text or "native")
    live: dict[str, int] = {}
    failed: set[str] = set()
    for i, ev in enumerate(events):
        if ev.op == "alloc":
            if ev.name in live:
                raise TraceError(f"{source}: event {i}: '{ev.name}' is allocated again before it was freed")
            try:
                live[ev.name] = allocator.malloc(ev.size, ev.stream)
                failed.discard(ev.name)
            except OutOfMemoryError as e:
                failed.add(ev.name)
                result.ooms += 1
                if result.first_failure is None:
                    result.first_failure, result.first_failure_label = i, ev.label
                    result.first_failure_message = str(e)
        elif ev.op == "free":
            ptr = live.pop(ev.name, None)
            if ptr is None:
                if ev.name in failed:  # its allocation failed in this replay: nothing to free
                    failed.discard(ev.name)
                    continue
                raise TraceError(
                    f"{source}: event {i}: frees '{ev.name}', which the trace never allocated (a trace cut short "
                    "by record_memory_history's max_entries starts mid-run: record with a larger max_entries)"
                )
            allocator.free(ptr)
        elif ev.op == "empty_cache":
            allocator.empty_cache()
        else:
            raise TraceError(f"{source}: event {i}: unknown op {ev.op!r} (expected alloc, free or empty_cache)")
        if keep_samples:
            result.samples.append((allocator.memory_allocated(), allocator.memory_reserved()))
        if progress is not None and i % 4096 == 0:
            progress(i)
    stats = allocator.memory_stats()
    result.peak_allocated = stats["allocated_bytes.all.peak"]
    result.peak_reserved = stats["reserved_bytes.all.peak"]
    result.retries = stats["num_alloc_retries"]
    result.events = len(events)
    return result


def what_if(
    events: Sequence[Event], capacity: int | str, configs: Iterable[str], source: str = "<trace>",
    progress: bool = False,
) -> list[ReplayResult]:
    """Replay the same events under each config on a fresh simulated GPU of `capacity`."""
    results = []
    for conf in configs:
        bar = _progress_bar(len(events), conf) if progress else None
        alloc = CachingAllocator(SimulatedGPU(capacity), conf)
        alloc.record_memory_history(enabled=False)  # the trace is not needed, and it costs time
        results.append(replay(events, alloc, source, progress=bar))
        if bar is not None:
            bar(len(events))
            sys.stderr.write("\n")
    return results


def _progress_bar(total: int, label: str) -> Callable[[int], None]:
    def show(i: int) -> None:
        if sys.stderr.isatty() or i == total:
            width = 30
            done = int(width * i / max(total, 1))
            sys.stderr.write(f"\r{label or 'native':<40} [{'#' * done}{'.' * (width - done)}] {i}/{total}")
            sys.stderr.flush()

    return show


# -- reading traces ------------------------------------------------------------------------------------------------
def events_from_snapshot(snapshot: dict, source: str = "<snapshot>", device: int = 0) -> list[Event]:
    """Turn a snapshot's device_traces[device] into events (see the module docstring for the rules)."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces) or not traces[device]:
        raise TraceError(
            f"{source}: the snapshot has no trace for device {device}: record one with "
            "torch.cuda.memory._record_memory_history() (or minialloc's record_memory_history) before the run"
        )
    trace = traces[device]
    has_completion = any(e.get("action") == "free_completed" for e in trace)
    free_action = "free_completed" if has_completion else "free_requested"
    events: list[Event] = []
    names: dict[int, str] = {}
    for i, entry in enumerate(trace):
        action = entry.get("action")
        if action == "alloc":
            addr = entry["addr"]
            if addr in names:
                raise TraceError(f"{source}: trace entry {i}: address {addr:#x} allocated twice without a free")
            names[addr] = name = f"t{i}"
            events.append(Event("alloc", name, int(entry["size"]), int(entry.get("stream", 0)), f"trace entry {i}"))
        elif action == free_action:
            addr = entry["addr"]
            name = names.pop(addr, None)
            if name is None:
                raise TraceError(
                    f"{source}: trace entry {i}: frees address {addr:#x}, which the trace never allocated "
                    "(a ring buffer that dropped the start of the run? record with a larger max_entries)"
                )
            events.append(Event("free", name, label=f"trace entry {i}"))
        elif action == "oom":
            # the request that failed in the recorded run: try it again, and free it at once if it fits now,
            # since nothing after it in the trace could have used it
            name = f"oom{i}"
            label = f"trace entry {i}: failed with out of memory in the recorded run"
            events += [Event("alloc", name, int(entry["size"]), int(entry.get("stream", 0)), label),
                       Event("free", name, label=label)]
        elif action in ("segment_free", "segment_unmap") and _is_empty_cache(trace, i):
            events.append(Event("empty_cache", label=f"trace entry {i}"))
    return events


def _is_empty_cache(trace: list[dict], i: int) -> bool:
    """Was this release the start of an empty_cache() call?

    minialloc marks the entries empty_cache() writes (user_metadata "empty_cache"). In PyTorch's traces a run of
    releases that no malloc follows is one; a run followed by a new segment could also be a malloc's retry, and
    is taken as that: replaying the malloc under the same config releases the same blocks anyway.
    """
    if i > 0 and trace[i - 1].get("action") in ("segment_free", "segment_unmap"):
        return False  # only the first entry of the run stands for the call
    if trace[i].get("user_metadata") == "empty_cache":
        return True
    j = i
    while j < len(trace) and trace[j].get("action") in ("segment_free", "segment_unmap"):
        j += 1
    return j == len(trace) or trace[j].get("action") not in ("segment_alloc", "segment_map", "alloc", "oom")


def events_from_rmm_csv(path: str | Path) -> list[Event]:
    """Read an RMM logging_resource_adaptor CSV: Thread,Time,Action,Pointer,Size,Stream."""
    events: list[Event] = []
    names: dict[str, str] = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = {"Action", "Pointer", "Size", "Stream"}
        if reader.fieldnames is None or not need <= set(reader.fieldnames):
            raise TraceError(f"{path}: not an RMM log: the header must have {sorted(need)}, got {reader.fieldnames}")
        for i, row in enumerate(reader):
            where = f"{path}: row {i + 2}"  # the header is line 1
            try:
                action = row["Action"].strip().lower()
                ptr = row["Pointer"].strip().lower()
                size = int(row["Size"])
                stream = int(row["Stream"].strip(), 0)
            except (ValueError, AttributeError) as e:
                raise TraceError(f"{where}: cannot read the row {row}: {e}") from None
            if size < 0 or stream < 0:
                raise TraceError(f"{where}: negative size or stream in {row}")
            if action == "allocate":
                if ptr in names:
                    raise TraceError(f"{where}: pointer {ptr} allocated twice without a free")
                names[ptr] = name = f"r{i}"
                events.append(Event("alloc", name, size, stream, f"row {i + 2}"))
            elif action == "free":
                name = names.pop(ptr, None)
                if name is None:
                    raise TraceError(f"{where}: frees pointer {ptr}, which the log never allocated")
                events.append(Event("free", name, label=f"row {i + 2}"))
            elif action != "allocate failure":
                raise TraceError(f"{where}: unknown action {row['Action']!r} (allocate, free, allocate failure)")
    return events


def read_trace(path: str | Path) -> list[Event]:
    """Events from a snapshot pickle (PyTorch's or minialloc's) or an RMM CSV log, chosen by content."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(64)
    if head[:1] == b"\x80":  # a pickle's protocol marker
        try:
            snap = load_snapshot(path)
        except SnapshotError as e:
            raise TraceError(str(e)) from None
        return events_from_snapshot(snap, str(path))
    if head.startswith(b"Thread") or b"Action" in head:
        return events_from_rmm_csv(path)
    raise TraceError(
        f"{path}: neither a snapshot pickle (torch.cuda.memory._dump_snapshot, minialloc.dump_snapshot) "
        "nor an RMM CSV log (header Thread,Time,Action,Pointer,Size,Stream)"
    )
