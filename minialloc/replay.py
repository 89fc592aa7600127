"""Replay: run a recorded allocation trace through the allocator under other settings ("what if?").

The engineer's question after an OOM is "would expandable_segments, or max_split_size_mb:N, have saved my
run?". A trace answers it: replay the same mallocs and frees on a simulated GPU of the same size under each
config and compare peak reserved memory and OOMs. This is the model of RMM's REPLAY benchmark, which replays a
logging_resource_adaptor CSV against a chosen memory resource.

Inputs (read_trace):
- a PyTorch snapshot pickle (torch.cuda.memory._dump_snapshot) or a minialloc one: its device_traces;
- an RMM log CSV with the columns Thread,Time,Action,Pointer,Size,Stream.
A trace becomes a list of workloads.MemoryOp (one allocator operation each), so a generated workload replays the
same way (replay_ops).

Recorded runs (replay_trace, what_if_trace, check_trace): a real trace starts mid-run, so by default a replay
starts from the state at the trace's first entry, rebuilt by minialloc.trace.state_at_trace_start at the
recorded addresses, and runs the trace's operations (minialloc.trace.device_ops). Under the run's own settings
every allocation should then land at its recorded address: check_trace counts them, which is what makes the
what-if rows worth trusting. For a trace that starts mid-run, each what-if row (the recorded settings' too)
starts from the blocks at the first entry (live and cached) re-laid by its own policy (replay_trace's relaid,
minialloc.relay), so the rows compare with each other; with relaid=False (`--keep-start`) a row starts from the
run's segments as they were, as if its setting had been switched on at the first trace entry.
bench/relaid_whatif.py measures how well re-laid rows predict a run made under their setting. Without a
capacity the simulated GPU is unlimited and the rows compare peak reserved memory; with one (given, or read
from an 'oom' entry: reserved then plus the driver's free bytes) they show who runs out of memory, and where.

From a snapshot trace: 'alloc' entries allocate their requested size; a block is freed at 'free_completed'
(when PyTorch could reuse it; 'free_requested' when the trace has no completion); an 'oom' entry is the request
that failed, tried again; a run of segment_free / segment_unmap entries that is not part of a malloc is an
empty_cache() call (see _is_empty_cache). So a replay of a minialloc snapshot under the run's own config and
capacity reproduces its peak reserved exactly.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .allocator import CachingAllocator
from .device import DeviceError, SimulatedGPU
from .lang import messages, say
from .oom import OutOfMemoryError
from .relay import relay_start
from .sizes import PAGE_SIZE, readable_size
from .trace import (
    EMPTY_CACHE,
    FREE,
    MALLOC,
    NEXT_TIME,
    OOM,
    RETRY_RELEASE,
    DeviceTrace,
    TraceError,
    describe,
    read_device_trace,
    read_snapshot,
    state_at_trace_start,
    user_frames,
)
from .workloads import MemoryOp

# What replay and --check print for a person, in the notebook's (or MINIALLOC_LANG's) language: minialloc.lang.
# The JSON keeps its English keys; the labels and notes a result carries stay English there too and are
# translated when shown (shown_label, verdict).
TEXT = messages("minialloc.replay.TEXT", {
    "check": "device {device}: {ok} of {total} allocations at the recorded address",
    "ooms_reproduced": "  {reproduced} of {recorded} recorded out-of-memory failures reproduced on a device of "
                       "{capacity} (reserved + device free at the first one)",
    "ooms_not_reproduced": "  {reproduced} of {recorded} recorded out-of-memory failures NOT reproduced on a device "
                           "of {capacity} (reserved + device free at the first one)",
    "from_frames": " (from {frames})",
    "landed_new_segment": "in memory the run never reserved: the replay asked the device for a new segment where "
                          "the run served the request from its cache",
    "landed_elsewhere": "elsewhere in the run's segments",
    "first_divergence": "  first divergence at trace entry {entry}: a request of {size}{where} that the run placed "
                        "at {recorded} went to {replayed}, {landed}",
    "around": "  the trace around it:",
    "unreliable": "  from entry {entry} on the replay does not follow the run, so what replay and diagnose report "
                  "past it is unreliable: the snapshot's allocator_settings, or minialloc's model of the allocator, "
                  "do not match this run there (please report it with the snapshot)",
    "as_recorded": "as recorded ({config})",
    "relaid": "{config}, re-laid",
    "recorded_settings": "the recorded settings ({config})",
    "warning_diverges": "warning: the replay under the recorded settings diverges from the run at trace entry "
                        "{entry} (see --check): these figures are unreliable",
    "note_from_empty": "note: replayed from an empty GPU (--from-empty), leaving out the {reserved} the run had "
                       "reserved at the first trace entry ({blocks} live, {requested} requested); drop "
                       "--from-empty for the run's own figures",
    "block_one": "{n} block",
    "block_many": "{n} blocks",
    "note": "note: {labels}: {note}",
    "and": " and ",
    "note_expandable_start": "replayed on top of the run's expandable segments (rebuilt as they were, with "
                             "mappings it never makes itself), so its peak is no estimate of a run under it from "
                             "the start: compare the rows with --from-empty",
    "note_relaid_no_fit": "the live blocks at the first trace entry do not fit on this device under it",
    "the_run": "the run",
    "the_run_from_empty": "the replay from an empty GPU",
    "no_limit_peak": "no capacity limit: under the recorded settings {run} peaks at {peak} reserved",
    "lowest_peak": "{peak}; the lowest peak is {lowest}, with {name}",
    "smallest_device": "{peak}; the smallest device found is {size}, with {name}",
    "bounded": " (bounded by the {reserved} already reserved at the first trace entry: record from earlier in the "
               "run to see what a setting changes before it)",
    "fits": "{run} fits in {capacity} under the recorded settings (peak reserved {peak}); the lowest peak is "
            "{lowest}, with {name}",
    "relaid_fits": "the recorded settings fail as recorded, but fit in {capacity} once the blocks at the first "
                   "trace entry are re-laid ({others} too): the OOM comes from how memory was laid out before the "
                   "trace began; record from earlier in the run to see which setting avoids it",
    "no_other": "no other setting",
    "saves": "{name} saves this run: it fits in {capacity} (peak reserved {peak})",
    "fragmentation": "no setting tried saves this run, yet {live} live + the {request} request at trace entry "
                     "{entry} fit in {capacity}: the cause is fragmentation",
    "fragmentation_before": ". The {reserved} of segments made before the trace began stay as they were in a "
                            "replay, whatever the setting: turn on expandable_segments:True in the run itself, or "
                            "record from earlier in the run to replay it",
    "needs_more": "no setting saves this run: {live} are live at trace entry {entry} when {request} is requested, "
                  "on a device of {capacity}: it needs at least {more} more memory or fewer live tensors",
})
_NOTE_KEYS = ("note_expandable_start", "note_relaid_no_fit")


def shown_label(r: ReplayResult) -> str:
    """A row's label as a person reads it, in the notebook's language (the result keeps the English for JSON)."""
    if r.label == f"as recorded ({r.config})":
        return say(TEXT, "as_recorded", config=r.config)
    if r.label == f"{r.config}, re-laid":
        return say(TEXT, "relaid", config=r.config)
    return r.label


def _shown_note(note: str) -> str:
    key = next((k for k in _NOTE_KEYS if TEXT[k].english == note), None)
    return note if key is None else say(TEXT, key)


__all__ = ["ReplayResult", "StartStateDoesNotFit", "TraceError", "UNLIMITED", "check_trace", "read_trace", "replay",
           "replay_ops", "replay_trace", "smallest_capacity", "state_at_trace_start", "verdict", "what_if",
           "what_if_trace"]

# the what-if rows `minialloc replay` and `diagnose` try when no --conf is given
DEFAULT_WHAT_IF = ("", "expandable_segments:True", "max_split_size_mb:256")
UNLIMITED = 1 << 50  # a simulated GPU of 1 PiB stands for "no capacity limit" (it costs no host memory)


class StartStateDoesNotFit(TraceError):
    """The capacity asked for is smaller than what the run had already reserved at the first trace entry: the
    run itself would not fit there, so there is nothing to replay (an answer, not bad input)."""


def check_capacity(capacity: int | None) -> None:
    """A capacity must be a positive number of bytes (None: no limit); 0 would read as both."""
    if capacity is not None and capacity <= 0:
        raise ValueError(f"capacity must be > 0, got {capacity} bytes (leave it out for no limit)")


def check_configs(configs: Iterable[str]) -> None:
    """Refuse a config the replay cannot run before any replay starts, naming it as the user typed it and
    listing only the keys PyTorch's PYTORCH_CUDA_ALLOC_CONF accepts."""
    from .config import AllocatorConfig, ConfigError

    for text in configs:
        try:
            AllocatorConfig.parse(text)
        except ConfigError as e:
            reason = str(e).split(" in minialloc allocator config")[0].split(". Accepted keys")[0]
            raise ValueError(f"config {text!r}: {reason}; PyTorch's keys: {', '.join(PYTORCH_CONF_KEYS)} "
                             "(e.g. expandable_segments:True)") from None
        if "backend" in text or "debug_guards" in text:
            raise ValueError(f"config {text!r}: only PyTorch's keys can be tried: {', '.join(PYTORCH_CONF_KEYS)}")


# the PYTORCH_CUDA_ALLOC_CONF keys a replay can try (minialloc's own keys, backend and debug_guards, change
# nothing a replay compares)
PYTORCH_CONF_KEYS = ("expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb",
                     "garbage_collection_threshold", "roundup_power2_divisions", "large_segment_size_mb",
                     "per_process_memory_fraction")


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
    # recorded runs (replay_trace) only:
    label: str = ""  # "as recorded" for the run's own settings
    capacity: int | None = None  # None: no limit
    first_failure_entry: int | None = None  # index in device_traces[device] of the first failed request
    first_failure_size: int = 0
    first_failure_frames: list[str] = field(default_factory=list)  # the request's top user frames, if recorded
    live_at_failure: int = 0  # allocated bytes when the first failure happened
    # the OOM message's "largest free block" at the first failure: cached, or what the device can still give
    largest_free_at_failure: int = 0
    reserved_at_failure: int = 0
    skipped_frees: int = 0  # --from-empty: frees of blocks allocated before the trace began
    fits_on: int | None = None  # the smallest device it runs on without an OOM (smallest_capacity)
    # as recorded: the first trace entry whose allocation did not land at its recorded address (from there the
    # replay no longer follows the run, so its figures describe some other run)
    diverged_at: int | None = None
    # --from-empty: what the run had at the first trace entry and this replay leaves out
    left_out_reserved: int = 0
    left_out_live_blocks: int = 0
    left_out_live_bytes: int = 0
    notes: list[str] = field(default_factory=list)  # caveats on this row's figures, one sentence each
    relaid: bool = False  # started from the blocks at the first entry (live and cached), re-laid under this config

    @property
    def efficiency(self) -> float:
        """Peak allocated / peak reserved: 1.0 means no byte was held that the program did not use."""
        return self.peak_allocated / self.peak_reserved if self.peak_reserved else 1.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("samples")
        d["efficiency"] = round(self.efficiency, 4)
        if self.label:  # a recorded run's row: one name for the failure (its trace entry), and operations
            for key in ("first_failure", "first_failure_label", "events"):
                d.pop(key)
            d["operations"] = self.events  # replay operations, fewer than trace entries (segment events ride along)
        return d

    @property
    def failed(self) -> bool:
        return self.ooms > 0


def replay_ops(
    events: Sequence[MemoryOp],
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


replay = replay_ops  # the name the course imports (from minialloc.replay import replay)


def what_if(
    events: Sequence[MemoryOp], capacity: int | str, configs: Iterable[str], source: str = "<trace>",
    progress: bool = False,
) -> list[ReplayResult]:
    """Replay the same events under each config on a fresh simulated GPU of `capacity`."""
    results = []
    for conf in configs:
        bar = progress_bar(len(events), conf or "native") if progress else None
        alloc = CachingAllocator(SimulatedGPU(capacity), conf)
        alloc.record_memory_history(enabled=False)  # the trace is not needed, and it costs time
        results.append(replay_ops(events, alloc, source, progress=None if bar is None else bar.update_to))
        if bar is not None:
            bar.close()
    return results


class _Bar:
    """tqdm.auto's bar (a widget in JupyterLab, a bar on a terminal, nothing in a pipe), updated in jumps."""

    def __init__(self, total: int, label: str) -> None:
        self.done = 0
        try:
            from tqdm.auto import tqdm
        except ImportError:  # a declared dependency, but a bar is not worth failing a replay over
            self.bar = None
            return
        # disable=None: no bar when stderr is no terminal (a pipe, a log); tqdm.auto's notebook bar is a widget
        notebook = "notebook" in tqdm.__module__
        self.bar = tqdm(total=total, desc=label[:40], unit="op", leave=False, disable=False if notebook else None)

    def update_to(self, i: int) -> None:
        if self.bar is not None:
            self.bar.update(i - self.done)
        self.done = i

    def close(self) -> None:
        if self.bar is not None:
            self.update_to(self.bar.total or self.done)
            self.bar.close()


def progress_bar(total: int, label: str) -> _Bar:
    return _Bar(total, label)


# -- reading traces ------------------------------------------------------------------------------------------------
def events_from_snapshot(snapshot: dict, source: str = "<snapshot>", device: int = 0) -> list[MemoryOp]:
    """A snapshot's device_traces[device] as events to replay from an empty GPU (minialloc.trace.device_ops).

    A trace that frees a block it never allocated started mid-run: replay it with replay_trace, which rebuilds
    the state at its first entry, rather than as events."""
    events: list[MemoryOp] = []
    names: dict[int, str] = {}
    trace = read_device_trace(snapshot, device, source, from_empty=True)  # TraceError if it has no trace
    for kind, i, size, stream, addr, _ in trace.ops:
        if kind == MALLOC:
            if addr in names:
                raise TraceError(f"{source}: trace entry {i}: address {addr:#x} allocated twice without a free")
            names[addr] = name = f"t{i}"
            events.append(MemoryOp("alloc", name, size, stream, f"trace entry {i}"))
        elif kind == FREE:
            name = names.pop(addr, None)
            if name is None:
                raise TraceError(
                    f"{source}: trace entry {i}: frees address {addr:#x}, which the trace never allocated: the "
                    "trace started mid-run (replay it from the state at its first entry: replay_trace)"
                )
            events.append(MemoryOp("free", name, label=f"trace entry {i}"))
        elif kind == OOM:
            # the request that failed in the recorded run: try it again, and free it at once if it fits now,
            # since nothing after it in the trace could have used it
            name = f"oom{i}"
            label = f"trace entry {i}: failed with out of memory in the recorded run"
            events += [MemoryOp("alloc", name, size, stream, label), MemoryOp("free", name, label=label)]
        elif kind == EMPTY_CACHE:
            events.append(MemoryOp("empty_cache", label=f"trace entry {i}"))
        # RETRY_RELEASE: the malloc after it releases what it needs again, on a GPU of the same size
    return events


def events_from_rmm_csv(path: str | Path) -> list[MemoryOp]:
    """Read an RMM logging_resource_adaptor CSV: Thread,Time,Action,Pointer,Size,Stream."""
    events: list[MemoryOp] = []
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
                events.append(MemoryOp("alloc", name, size, stream, f"row {i + 2}"))
            elif action == "free":
                name = names.pop(ptr, None)
                if name is None:
                    raise TraceError(f"{where}: frees pointer {ptr}, which the log never allocated")
                events.append(MemoryOp("free", name, label=f"row {i + 2}"))
            elif action != "allocate failure":
                raise TraceError(f"{where}: unknown action {row['Action']!r} (allocate, free, allocate failure)")
    return events


def check_trace_file(path: str | Path) -> None:
    """TraceError naming the file when it cannot be a trace at all: missing, a directory, empty, or JSON (a
    snapshot is the pickle torch.cuda.memory._dump_snapshot writes)."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{path}: no such file")
    if p.is_dir():
        raise TraceError(f"{path}: is a directory, not a snapshot pickle")
    try:
        with open(p, "rb") as f:
            head = f.read(64)
    except OSError as e:
        raise TraceError(f"{path}: cannot read the file: {e.strerror or e}") from None
    if not head:
        raise TraceError(f"{path}: empty file, not the pickle torch.cuda.memory._dump_snapshot writes")
    if head.lstrip()[:1] in (b"{", b"["):
        raise TraceError(f"{path}: JSON, not the pickle torch.cuda.memory._dump_snapshot writes")


def load_trace_file(path: str | Path) -> dict:
    """A snapshot pickle, or TraceError naming the file and what is wrong with it."""
    check_trace_file(path)
    return read_snapshot(path)


def read_trace(path: str | Path) -> list[MemoryOp]:
    """Events from a snapshot pickle (PyTorch's or minialloc's) or an RMM CSV log, chosen by content."""
    path = Path(path)
    check_trace_file(path)
    with open(path, "rb") as f:
        head = f.read(64)
    if head[:1] == b"\x80":  # a pickle's protocol marker
        return events_from_snapshot(load_trace_file(path), str(path))
    if head.startswith(b"Thread") or b"Action" in head:
        return events_from_rmm_csv(path)
    raise TraceError(
        f"{path}: neither a snapshot pickle (torch.cuda.memory._dump_snapshot, minialloc.dump_snapshot) "
        "nor an RMM CSV log (header Thread,Time,Action,Pointer,Size,Stream)"
    )


# -- recorded runs: replay from the state at the first trace entry ---------------------------------------------
@dataclass
class CheckResult:
    """replay under the recorded settings from the rebuilt state, every address compared with the recorded one."""

    device: int
    allocations: int = 0
    at_recorded_address: int = 0
    first_divergence: int | None = None  # trace entry index
    recorded_address: int | None = None  # None while nothing diverged
    replayed_address: int | None = None
    request: int = 0  # the diverging request's size
    frames: list[str] = field(default_factory=list)  # its top user frames, if recorded
    new_segment: bool = False  # the replay put it in memory the run never reserved
    context: list[str] = field(default_factory=list)
    capacity: int | None = None  # from the first 'oom' entry (reserved then + device_free); None: no limit
    recorded_ooms: int = 0  # the run's 'oom' entries
    reproduced_ooms: int = 0  # of them, those that failed again in the replay

    @property
    def ok(self) -> bool:
        return self.allocations == self.at_recorded_address and self.reproduced_ooms == self.recorded_ooms

    def summary(self) -> str:
        lines = [say(TEXT, "check", device=self.device, ok=self.at_recorded_address, total=self.allocations)]
        if self.recorded_ooms:
            how = "ooms_reproduced" if self.reproduced_ooms == self.recorded_ooms else "ooms_not_reproduced"
            lines.append(say(TEXT, how, reproduced=self.reproduced_ooms, recorded=self.recorded_ooms,
                             capacity=readable_size(self.capacity or 0)))
        if self.first_divergence is None:
            return "\n".join(lines)
        where = say(TEXT, "from_frames", frames="; ".join(self.frames)) if self.frames else ""
        landed = say(TEXT, "landed_new_segment" if self.new_segment else "landed_elsewhere")
        lines += [say(TEXT, "first_divergence", entry=self.first_divergence, size=readable_size(self.request),
                      where=where, recorded=f"{self.recorded_address:#x}", replayed=f"{self.replayed_address:#x}",
                      landed=landed),
                  say(TEXT, "around"), *("    " + c for c in self.context),
                  say(TEXT, "unreliable", entry=self.first_divergence)]
        return "\n".join(lines)


def replay_trace(
    trace: DeviceTrace, config: str, capacity: int | None = None, *, label: str = "", at_recorded: bool = False,
    check: CheckResult | None = None, keep_samples: bool = False, until: int | None = None,
    progress: bool = False, relaid: bool = False, cache: bool = True, stop_at_failure: bool = False,
) -> tuple[ReplayResult, CachingAllocator]:
    """Replay a recorded device trace from its rebuilt start state (trace.start_segments) under `config`.

    capacity None: unlimited. at_recorded: place each new segment where the run got it (segment_alloc), so the
    allocator under the recorded settings can land every block at its recorded address; check collects that
    comparison. until: stop before the operation of that trace entry (the state a diagnosis looks at). An OOM is
    counted and the request skipped, as the recorded run's own 'oom' entries are; its later free is skipped too.
    relaid: start from the blocks at the first entry, each allocated again (in address order, on its stream and
    in its pool) under `config`'s own policy and the cached ones freed again, instead of the run's segments as
    they were: the start a run under that config from its beginning would more nearly have had
    (minialloc.relay.relay_start; cache=False: the live blocks only). stop_at_failure: end at the first OOM, for
    a search that only asks whether the trace fits (smallest_capacity); the peaks are then those until it.
    """
    check_capacity(capacity)
    if relaid:
        return _replay_relaid(trace, config, capacity, label=label, keep_samples=keep_samples, until=until,
                              progress=progress, cache=cache, stop_at_failure=stop_at_failure)
    if capacity is not None and capacity < trace.reserved_at_start:
        raise StartStateDoesNotFit(
            f"device {trace.device} does not fit in {readable_size(capacity)}: "
            f"{readable_size(trace.reserved_at_start)} is already reserved at the first trace entry; record from "
            "earlier in the run, or use --from-empty")
    gpu = SimulatedGPU(capacity or unlimited_capacity(trace), index=trace.device)
    a = CachingAllocator(gpu, config)
    a.record_memory_history(enabled=False)  # the trace is not needed, and it costs time
    if trace.start_segments:
        try:
            a.restore_segments(trace.start_segments)
        except DeviceError:  # the segments add up to less than the capacity, but do not fit at their addresses
            raise StartStateDoesNotFit(
                f"device {trace.device}: the {readable_size(trace.reserved_at_start)} reserved at the first trace "
                f"entry does not fit at its recorded addresses in {readable_size(capacity or 0)}; record from "
                "earlier in the run, or use --from-empty") from None
        except ValueError as e:
            raise TraceError(f"device {trace.device}: cannot rebuild the state at the first trace entry: {e}") from None
    result = ReplayResult(config=config or "native", label=label or config or "native", capacity=capacity)
    if trace.from_empty:
        result.left_out_reserved = trace.recorded_reserved_at_start
        result.left_out_live_blocks, result.left_out_live_bytes = trace.recorded_live_at_start
    elif (any(s["is_expandable"] for s in trace.start_segments)
          and "expandable_segments:true" not in config.replace(" ", "").lower()):
        result.notes.append(TEXT["note_expandable_start"].english)  # English in the JSON; verdict translates it
    live: dict[int, int] = {addr: addr for addr in trace.live_at_start}
    # placing new segments where the run got them is right only while the replay follows the run exactly
    return _run_ops(trace, a, gpu, result, live, check=check, keep_samples=keep_samples, until=until,
                    progress=progress, place=(at_recorded or check is not None) and not trace.from_empty,
                    stop_at_failure=stop_at_failure)


def _replay_relaid(trace: DeviceTrace, config: str, capacity: int | None, *, label: str, keep_samples: bool,
                   until: int | None, progress: bool, cache: bool = True, stop_at_failure: bool = False,
                   ) -> tuple[ReplayResult, CachingAllocator]:
    gpu = SimulatedGPU(capacity or unlimited_capacity(trace), index=trace.device)
    a = CachingAllocator(gpu, config)
    a.record_memory_history(enabled=False)
    result = ReplayResult(config=config or "native", label=label or f"{config or 'native'}, re-laid",
                          capacity=capacity)
    live, failure = relay_start(trace, a, cache=cache)
    if failure is not None:
        size, e = failure
        result.notes.append(TEXT["note_relaid_no_fit"].english)
        _failed(result, trace, 0, size, e, a)
        stats = a.memory_stats()
        result.peak_allocated = stats["allocated_bytes.all.peak"]
        result.peak_reserved = stats["reserved_bytes.all.peak"]
        return result, a
    return _run_ops(trace, a, gpu, result, live, keep_samples=keep_samples, until=until, progress=progress,
                    place=False, stop_at_failure=stop_at_failure)


def _run_ops(trace: DeviceTrace, a: CachingAllocator, gpu: SimulatedGPU, result: ReplayResult, live: dict[int, int],
             *, check: CheckResult | None = None, keep_samples: bool, until: int | None, progress: bool, place: bool,
             stop_at_failure: bool = False) -> tuple[ReplayResult, CachingAllocator]:
    """The trace's operations on an allocator holding the start state; live: recorded address -> its block now.
    stop_at_failure: end at the first OOM (all a "does it fit?" question needs; the peaks then stop there)."""
    failed: set[int] = set()
    ops = trace.ops
    bar = progress_bar(len(ops), result.label) if progress else None
    samples = result.samples
    placing = place
    left_run = False  # a request the run served failed in this replay
    malloc, free = a.malloc, a.free
    pool_of = trace.pool_of
    # the run's private pools, held for the whole replay as the run held them (empty_cache leaves them alone)
    mem_pools = {pool_id: a.replay_pool(pool_id) for pool_id in sorted(set(pool_of.values()))}
    for k, (kind, i, size, stream, addr, segs) in enumerate(ops):
        if until is not None and i >= until:
            break
        # an allocation the run made inside use_mem_pool (or a graph's capture) is made in that pool again
        routed = a.use_mem_pool(mem_pools[pool_of[i]]) if pool_of and i in pool_of else None
        if routed is not None:
            routed.__enter__()
        try:
            if kind == MALLOC:
                if placing and segs:
                    for seg in segs:
                        if seg > 0:
                            gpu.place_next(seg)
                        elif gpu.reservation_at(-seg) is None:  # a new expandable segment, mapped from its start
                            gpu.place_next_reservation(-seg)
                try:
                    ptr = malloc(size, stream)
                except OutOfMemoryError as e:
                    failed.add(addr)
                    left_run = True
                    _failed(result, trace, i, size, e, a)
                    if stop_at_failure:
                        break
                    continue
                finally:
                    if place and segs:
                        gpu.drop_placements()
                live[addr] = ptr
                if ptr != addr:
                    placing = False
                    # after a request failed here that the run served, the addresses differ for that reason alone
                    if place and result.diverged_at is None and not left_run:
                        result.diverged_at = i
                if check is not None:
                    check.allocations += 1
                    if ptr == addr:
                        check.at_recorded_address += 1
                    elif check.first_divergence is None:
                        check.first_divergence, check.recorded_address, check.replayed_address = i, addr, ptr
                        check.request = size
                        check.frames = user_frames(trace.entries[i].get("frames"))
                        check.new_segment = not _recorded_memory(trace, ptr)
                        near = range(max(0, i - 3), min(len(trace.entries), i + 2))
                        check.context = [describe(trace.entries, j) for j in near]
            elif kind == FREE:
                ptr = live.pop(addr, None)
                if ptr is None:
                    if addr in failed:
                        failed.discard(addr)
                    elif not trace.from_empty:
                        raise TraceError(f"device {trace.device}: trace entry {i} frees {addr:#x}, which is not live "
                                         "in the replay (the rebuilt state at the first entry is inconsistent)")
                    else:
                        result.skipped_frees += 1  # --from-empty: allocated before the trace began
                    continue
                free(ptr)
            elif kind == EMPTY_CACHE or kind == RETRY_RELEASE:
                if placing and all(seg > 0 for seg in segs):
                    for seg in segs:  # exactly the segments the run gave back
                        if not a.release_cached_segment(seg):
                            placing = False  # not a whole free segment here: the replay has left the run
                            a.empty_cache()
                            break
                elif kind == EMPTY_CACHE or placing:  # a mapped range: empty_cache unmaps every wholly free page
                    a.empty_cache()
            elif kind == OOM:
                if check is not None:
                    check.recorded_ooms += 1
                try:
                    free(malloc(size, stream))  # fits here: nothing later in the trace used it
                except OutOfMemoryError as e:
                    _failed(result, trace, i, size, e, a)
                    if check is not None:
                        check.reproduced_ooms += 1
                    if stop_at_failure:
                        break
        finally:
            if routed is not None:
                routed.__exit__(None, None, None)
        if keep_samples:
            samples.append((a.memory_allocated(), a.memory_reserved()))
        if bar is not None and k % 4096 == 0:
            bar.update_to(k)
    if bar is not None:
        bar.close()
    stats = a.memory_stats()
    result.peak_allocated = stats["allocated_bytes.all.peak"]
    result.peak_reserved = stats["reserved_bytes.all.peak"]
    result.retries = stats["num_alloc_retries"]
    result.events = len(ops)
    return result, a


def unlimited_capacity(trace: DeviceTrace) -> int:
    """The simulated capacity that stands for "no limit". An expandable segment reserves address space for 1 1/8
    of the device, so where the recorded run had several, the device can be no bigger than lets their recorded
    reservations sit side by side (the real device was no bigger either): those at the first entry and those
    first mapped inside the trace, which a replay must be able to place where the run had them."""
    bases = list(trace.expandable_bases) or sorted(s["address"] for s in trace.start_segments if s["is_expandable"])
    room = min((b - a for a, b in zip(bases, bases[1:], strict=False)), default=UNLIMITED * 9 // 8)
    return min(UNLIMITED, (room - 10 * PAGE_SIZE) * 8 // 9 // PAGE_SIZE * PAGE_SIZE)  # 10 pages: one large page


def _failed(result: ReplayResult, trace: DeviceTrace, i: int, size: int, e: OutOfMemoryError,
            a: CachingAllocator) -> None:
    result.ooms += 1
    if result.first_failure_entry is None:
        result.first_failure = result.first_failure_entry = i
        result.first_failure_label = f"trace entry {i}"
        result.first_failure_size = size
        result.first_failure_message = str(e)
        result.first_failure_frames = user_frames(trace.entries[i].get("frames"))
        result.live_at_failure = a.memory_allocated()
        result.reserved_at_failure = a.memory_reserved()
        result.largest_free_at_failure = e.report.largest_free_block if e.report is not None else 0


def _recorded_memory(trace: DeviceTrace, addr: int) -> bool:
    """Whether addr lies in memory the run reserved: a segment at the first entry, or one the trace made."""
    ranges = [(s["address"], s["total_size"]) for s in trace.start_segments]
    ranges += [(int(e["addr"]), int(e["size"])) for e in trace.entries
               if e.get("action") in ("segment_alloc", "segment_map")]
    return any(start <= addr < start + size for start, size in ranges)


def check_trace(trace: DeviceTrace, config: str, progress: bool = False) -> CheckResult:
    """Replay under `config` (the recorded settings) at the recorded addresses and compare every allocation.

    Where the trace has an 'oom' entry the device is as large as PyTorch could use then (reserved + device_free),
    so the check also says whether the recorded failures happen again."""
    capacity = trace.capacity_at_oom()
    if capacity is not None and capacity < trace.reserved_at_start:
        capacity = None  # the oom's figures contradict the rebuilt start: compare addresses without a limit
    check = CheckResult(trace.device, capacity=capacity)
    replay_trace(trace, config, capacity, check=check, progress=progress)
    return check


def smallest_capacity(trace: DeviceTrace, config: str, unlimited: ReplayResult, max_replays: int = 20,
                      relaid: bool = False, cache: bool = True) -> int:
    """The smallest simulated device (in 2 MiB pages) on which the replay runs without an OOM, by bisection.

    The unlimited run never reserves more than its peak, so a device of that size fits; one smaller than what
    is live at the start or at the peak cannot. In between, bisection to 1/1000 of the upper bound (fitting is
    not always monotone in capacity, so this is the smallest capacity the bisection found). The first probe is
    one tolerance below the upper bound: a run whose cache grows to what it needs (most native runs) fails there,
    and one replay answers instead of ten. Each probe stops at its first OOM (stop_at_failure)."""
    hi = -(-unlimited.peak_reserved // PAGE_SIZE) * PAGE_SIZE
    # never below 0: every capacity tried must be a real one (a 0-byte device is refused)
    floor = 0 if relaid else trace.reserved_at_start  # a re-laid start holds no segment as it was
    lo = max(0, max(floor, unlimited.peak_allocated) // PAGE_SIZE * PAGE_SIZE - PAGE_SIZE)
    tolerance = max(PAGE_SIZE, hi // 1000)
    for k in range(max_replays):
        if hi - lo <= tolerance:
            break
        mid = (hi - tolerance if k == 0 else (lo + hi) // 2) // PAGE_SIZE * PAGE_SIZE
        if mid <= lo:
            mid = (lo + hi) // 2 // PAGE_SIZE * PAGE_SIZE
        try:
            result, _ = replay_trace(trace, config, mid, relaid=relaid, cache=cache, stop_at_failure=True)
            fits = not result.failed
        except TraceError:  # the start state does not fit on it
            fits = False
        lo, hi = (lo, mid) if fits else (mid, hi)
    return hi


def starts_mid_run(trace: DeviceTrace) -> bool:
    """Whether the run held memory at the first trace entry (so a what-if that keeps it as it was is bounded by
    it, and the re-laid mode answers instead)."""
    return not trace.from_empty and bool(trace.reserved_at_start)


def what_if_trace(
    trace: DeviceTrace, recorded: str, configs: Sequence[str] = (), capacity: int | None = None, *,
    fit: bool = True, progress: bool = False, relaid: bool | None = None,
) -> list[ReplayResult]:
    """The run's own settings (first row, labelled as recorded: exact), then each config, on one capacity.

    relaid (default: when the trace starts mid-run): the configs' rows, the recorded one's first, start from
    the blocks at the first entry (live and cached) re-laid by each config's own policy (replay_trace's relaid),
    so they compare with each other; otherwise each starts from the run's segments as they were, as if the setting had
    been switched on at the first entry."""
    check_capacity(capacity)
    check_configs(configs)
    if relaid is None:
        relaid = starts_mid_run(trace)
    rows = [(recorded, f"as recorded ({recorded or 'native'})", False)]
    if relaid:
        rows += [(c, f"{c or 'native'}, re-laid", True) for c in dict.fromkeys([recorded, *configs])]
    else:
        rows += [(c, c or "native", False) for c in configs if c != recorded]
    results = []
    for conf, label, relay in rows:
        result, _ = replay_trace(trace, conf, capacity, label=label, at_recorded=conf == recorded and not relay,
                                 progress=progress, relaid=relay)
        result.relaid = relay
        if fit:
            unlimited = result if capacity is None else replay_trace(trace, conf, None, relaid=relay)[0]
            result.fits_on = smallest_capacity(trace, conf, unlimited, relaid=relay)
        results.append(result)
    return results


def _name(r: ReplayResult, recorded: ReplayResult) -> str:
    """A row as a sentence names it: the first row is the run's own settings."""
    return say(TEXT, "recorded_settings", config=r.config) if r is recorded else shown_label(r)


def verdict(results: Sequence[ReplayResult], capacity: int | None, reserved_at_start: int = 0) -> str:
    """What a user can act on, one short line each: a warning when the as-recorded replay left the run, the
    verdict, then the rows' caveats. reserved_at_start: what the run held at the first trace entry, which no
    setting replayed from there can give back. Every figure is one the replays measured."""
    check_capacity(capacity)
    recorded = results[0]
    lines = []
    if recorded.diverged_at is not None:
        lines.append(say(TEXT, "warning_diverges", entry=recorded.diverged_at))
    lines.append(_verdict_line(results, capacity, reserved_at_start))
    if recorded.left_out_reserved or recorded.left_out_live_blocks:
        n = recorded.left_out_live_blocks
        lines.append(say(TEXT, "note_from_empty", reserved=readable_size(recorded.left_out_reserved),
                         blocks=say(TEXT, "block_one" if n == 1 else "block_many", n=n),
                         requested=readable_size(recorded.left_out_live_bytes)))
    labelled: dict[str, list[str]] = {}  # one line per caveat, naming every row it applies to
    for r in results:
        for n in r.notes:
            labelled.setdefault(n, []).append(shown_label(r))
    lines += [say(TEXT, "note", labels=say(TEXT, "and").join(labels), note=_shown_note(n))
              for n, labels in labelled.items()]
    return "\n".join(lines)


def _verdict_line(results: Sequence[ReplayResult], capacity: int | None, reserved_at_start: int) -> str:
    recorded = results[0]
    # a replay from an empty GPU that left out what the run held is not "the run"
    run = say(TEXT, "the_run_from_empty" if recorded.left_out_reserved or recorded.left_out_live_blocks
              else "the_run")
    if capacity is None:
        peak = say(TEXT, "no_limit_peak", run=run, peak=readable_size(recorded.peak_reserved))
        fitted = [r for r in results if r.fits_on is not None]
        if not fitted:  # no search ran (--no-fit): compare the peaks, which were measured
            best = min(results, key=lambda r: r.peak_reserved)
            return say(TEXT, "lowest_peak", peak=peak, lowest=readable_size(best.peak_reserved),
                       name=_name(best, recorded))
        best = min(fitted, key=lambda r: (r.fits_on, r.peak_reserved))
        line = say(TEXT, "smallest_device", peak=peak, size=readable_size(best.fits_on or 0),
                   name=_name(best, recorded))
        if reserved_at_start and not best.relaid and (best.fits_on or 0) <= reserved_at_start + PAGE_SIZE:
            line += say(TEXT, "bounded", reserved=readable_size(reserved_at_start))
        return line
    saved = [r for r in results if not r.failed]
    if not recorded.failed:
        best = min(results, key=lambda r: r.peak_reserved)
        return say(TEXT, "fits", run=run, capacity=readable_size(capacity), peak=readable_size(recorded.peak_reserved),
                   lowest=readable_size(best.peak_reserved), name=_name(best, recorded))
    own = next((r for r in results if r.relaid and r.config == recorded.config), None)
    if own is not None and not own.failed:
        # re-laid, the run's own settings fit too: the failure came from where the blocks sat before the trace
        # began, which a re-laid start (the same blocks, placed again in address order) does not reproduce
        others = [shown_label(r) for r in saved if r is not own]
        return say(TEXT, "relaid_fits", capacity=readable_size(capacity),
                   others=", ".join(others) or say(TEXT, "no_other"))
    if saved:
        best = min(saved, key=lambda r: r.peak_reserved)
        return say(TEXT, "saves", name=shown_label(best), capacity=readable_size(capacity),
                   peak=readable_size(best.peak_reserved))
    live, request, entry = recorded.live_at_failure, recorded.first_failure_size, recorded.first_failure_entry
    if live + request <= capacity:
        # enough memory in all, in pieces: fragmentation, which the settings tried could not undo
        line = say(TEXT, "fragmentation", live=readable_size(live), request=readable_size(request), entry=entry,
                   capacity=readable_size(capacity))
        if reserved_at_start and not any(r.relaid for r in results):
            line += say(TEXT, "fragmentation_before", reserved=readable_size(reserved_at_start))
        return line
    return say(TEXT, "needs_more", live=readable_size(live), entry=entry, request=readable_size(request),
               capacity=readable_size(capacity), more=readable_size(live + request - capacity))


def open_device_traces(path: str | Path, device: int | None = None, from_empty: bool = False
                       ) -> tuple[dict, list[DeviceTrace]]:
    """Read a snapshot file and each replayable device's trace (or just `device`); TraceError with one line
    (trace.why_not_replayable) when there is none: no trace, one too short, or an allocator minialloc does not
    model."""
    from .trace import devices as snapshot_devices
    from .trace import why_not_replayable

    snap = load_trace_file(path)
    found = snapshot_devices(snap) if device is None else [device]
    reasons = {d: why_not_replayable(snap, d) for d in found}
    wanted = [d for d in found if reasons[d] is None]
    if not wanted:
        if device is not None and device not in snapshot_devices(snap):
            raise TraceError(f"{path}: nothing recorded for device {device}; the file has devices "
                             f"{', '.join(map(str, snapshot_devices(snap))) or 'none'}")
        reason = next((r for r in reasons.values() if r), f"no trace ({NEXT_TIME})")
        raise TraceError(f"{path}: {reason}")
    return snap, [read_device_trace(snap, d, str(path), from_empty) for d in wanted]
