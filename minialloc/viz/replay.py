"""Replay a list of events through a CachingAllocator, and move to any step of it quickly.

Events, replayed through a CachingAllocator on a SimulatedGPU built from a config:

    (size, stream, label)          size > 0: malloc(size, stream), the block named `label`;
                                   size < 0: free the live block named `label`
    (size, stream) or (size,)      the same, named by the event's index (so only a malloc)
    ("malloc", size[, stream[, label]])   ("free", label)   ("empty_cache",)
    ("record_stream", label, stream)      ("synchronize"[, stream])
    trace entry dicts              a snapshot's device_traces, read by minialloc.trace.device_ops, the one
                                   reader `minialloc replay` and `diagnose` use: alloc -> malloc, the
                                   block's free_completed -> free, a run of segment releases -> empty_cache
                                   (or, for a malloc's own retry under max_split_size, the release of exactly
                                   the segments the run gave back: the replay's GPU is too large to run out),
                                   oom -> the failed request again.
                                   A trace has no record_stream, so its replay frees every block at once.
                                   Replayed from empty, frees of blocks allocated before the trace began are
                                   dropped; Replay.from_snapshot starts from the state at the first entry
                                   instead, rebuilt at the recorded addresses (minialloc.trace).

A malloc that runs out of memory becomes an OOM step; later frees of that label are skipped.

Moving fast: the allocator moves forward from where it is; a backward move (or a jump) starts from the
nearest checkpoint, a pickled copy of the allocator taken every `checkpoint_every` events. So any step costs
at most one restore plus `checkpoint_every` events, a few milliseconds, whatever the trace's length. The
replay keeps no trace history (record_memory_history is off): it would be copied into every checkpoint.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import random
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..allocator import CachingAllocator
from ..device import SimulatedGPU
from ..lang import messages, say
from ..oom import OutOfMemoryError
from ..sizes import MiB, format_size
from ..snapshot import TRACE_ACTIONS, load_snapshot
from ..trace import EMPTY_CACHE, FREE, MALLOC, OOM, RETRY_RELEASE, device_ops, read_device_trace, recorded_config
from ..workloads import Event
from ._common import VizInputError

PROGRESS_EVENTS = 20_000  # from this many events on, precomputing shows a progress bar

# What each event did, as the stepper shows it, in English, shown in the notebook's language (minialloc.lang).
# An Op keeps its text as a message, (id, ((field, value), ...)), a plain tuple, put into words when it is shown.
TEXT = messages("minialloc.viz.replay.TEXT", {
    "raw": "{text}",
    "malloc": "malloc {size} on stream {stream} as {label}",
    "free": "free {label}",
    "empty_cache": "empty_cache()",
    "record_stream": "record_stream({label}, stream {stream})",
    "synchronize_stream": "synchronize(stream {stream})",
    "synchronize": "synchronize()",
    "trace_alloc": "entry {i}: alloc {size} on stream {stream}",
    "trace_free": "entry {i}: free {size}",
    "trace_empty_cache": "entry {i}: empty_cache() (its releases are in the trace)",
    "trace_retry_release": "entry {i}: a malloc's release-and-retry gives back {n} segment(s)",
    "trace_oom": "entry {i}: the request that failed in the run, {size}",
    "trace_oom_free": "entry {i}: (the failed request, freed at once if it fit)",
    "oom": "{what}: OUT OF MEMORY (asked the device for {size})",
    "skipped": "{what}: skipped, its malloc ran out of memory",
    "start": "start: nothing allocated",
    "start_trace": "start: the state at the first trace entry",
})

Message = tuple  # (message id, ((field, value), ...)); a field named "what" holds a message itself


def msg(key: str, **fields: Any) -> Message:
    """A message to put into words later (describe), in whatever language is current then."""
    return (key, tuple(fields.items()))


def describe(message: Message | str) -> str:
    """A message in the notebook's language (minialloc.lang); a plain string as it is."""
    if isinstance(message, str):
        return message
    key, fields = message
    return say(TEXT, key, **{k: describe(v) if k == "what" else v for k, v in fields})


class Op(NamedTuple):
    """One normalised event: kind is malloc, free, empty_cache, record_stream or synchronize.

    Replay keeps them as plain tuples: a tuple of plain values drops out of the garbage collector's sight, and
    a 100,000-event replay would otherwise add 100,000 objects to walk in every full collection."""

    kind: str
    size: int = 0
    stream: int | None = 0
    label: Any = None
    text: Message | str = ""  # what the event does, as a message (see describe)


def _int(value: Any, where: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise VizInputError(f"{where}: {what} must be an int, got {value!r}")
    return value


def _trace_ops(entries: list[dict[str, Any]], live: set[Any], read: Sequence[tuple] | None = None) -> list[Op]:
    """A trace's entries as Ops, through minialloc.trace's reader (labels are the recorded addresses). read: the
    entries as that reader already read them under the run's settings (Replay.from_snapshot passes them); without
    it they are read here, without the run's max_split_size, so a retry's release reads as empty_cache()."""
    for i, e in enumerate(entries):
        action = e.get("action")
        if action not in TRACE_ACTIONS:
            raise VizInputError(f"events[{i}].action: unknown trace action {action!r}")
        key = "device_free" if action == "oom" else "addr"
        if action != "snapshot":
            _int(e.get("size"), f"events[{i}]", "size")
            _int(e.get(key), f"events[{i}]", key)
    ops: list[Op] = []
    for kind, i, size, stream, addr, segments in device_ops(entries) if read is None else read:
        if kind == MALLOC:
            ops.append(Op("malloc", size, stream, addr, msg("trace_alloc", i=i, size=format_size(size),
                                                            stream=stream)))
        elif kind == FREE:
            if addr in live:  # else allocated before the trace began, and this replay started empty
                ops.append(Op("free", 0, None, addr, msg("trace_free", i=i, size=format_size(size))))
        elif kind == EMPTY_CACHE:
            ops.append(Op("empty_cache", text=msg("trace_empty_cache", i=i)))
        elif kind == RETRY_RELEASE:
            ops.append(Op("release", label=segments, text=msg("trace_retry_release", i=i, n=len(segments))))
        elif kind == OOM:
            label = ("oom", i)
            ops.append(Op("malloc", size, stream, label, msg("trace_oom", i=i, size=format_size(size))))
            ops.append(Op("free", 0, None, label, msg("trace_oom_free", i=i)))
        if ops and ops[-1].kind == "malloc":
            live.add(ops[-1].label)
        elif ops and ops[-1].kind == "free":
            live.discard(ops[-1].label)
    return ops


def normalize_events(events: Iterable[Any], live_at_start: Iterable[Any] = (),
                     trace_ops: Sequence[tuple] | None = None) -> list[Op]:
    """Turn any accepted event form into Ops, checking that every free names a block live at that point.
    live_at_start: labels live before the first event (a trace replayed from the state at its first entry).
    trace_ops: for trace entries, minialloc.trace's reading of them (DeviceTrace.ops), so it is not read twice."""
    events = list(events)
    live: set[Any] = set(live_at_start)
    if events and all(isinstance(ev, dict) for ev in events):
        return _trace_ops(events, live, trace_ops)
    ops: list[Op] = []
    for i, ev in enumerate(events):
        where = f"events[{i}]"
        op = _one(ev, where, len(ops))
        if op is None:
            continue
        if op.kind == "malloc":
            if op.label in live:
                raise VizInputError(f"{where}: {op.label!r} is already allocated and not freed")
            live.add(op.label)
        elif op.kind in ("free", "record_stream"):
            if op.label not in live:
                raise VizInputError(
                    f"{where}: {op.kind} of {op.label!r}, which is not allocated at that point"
                )
            if op.kind == "free":
                live.discard(op.label)
        ops.append(op)
    return ops


def _malloc(size: int, stream: int, label: Any) -> Op:
    return Op("malloc", size, stream, label, msg("malloc", size=format_size(size), stream=stream, label=repr(label)))


def _one(ev: Any, where: str, index: int) -> Op | None:
    if isinstance(ev, Event):  # minialloc.workloads' events, as generated or read from a trace
        if ev.op == "alloc":
            op = _malloc(_int(ev.size, where, "size"), _int(ev.stream, where, "stream"), ev.name)
            return Op(op.kind, op.size, op.stream, op.label, msg("raw", text=ev.label) if ev.label else op.text)
        if ev.op == "free":
            return Op("free", 0, None, ev.name, msg("free", label=repr(ev.name)))
        if ev.op == "empty_cache":
            return Op("empty_cache", text=msg("empty_cache"))
        raise VizInputError(f"{where}: unknown op {ev.op!r} (alloc, free or empty_cache)")
    if isinstance(ev, dict):
        raise VizInputError(f"{where}: a trace entry among other kinds of event; pass a trace's entries alone")
    if not isinstance(ev, (tuple, list)) or not ev:
        raise VizInputError(f"{where}: expected a tuple such as (size, stream, label) or ('free', label), "
                            f"got {ev!r}")
    head = ev[0]
    if isinstance(head, str):
        kind, args = head, list(ev[1:])
        if kind in ("malloc", "alloc") and 1 <= len(args) <= 3:
            size = _int(args[0], where, "size")
            stream = _int(args[1], where, "stream") if len(args) > 1 else 0
            if size <= 0 or stream < 0:
                raise VizInputError(f"{where}: malloc needs a size > 0 and a stream >= 0, got {ev!r}")
            label = args[2] if len(args) > 2 else index
            return _malloc(size, stream, label)
        if kind == "free" and len(args) == 1:
            return Op("free", 0, None, args[0], msg("free", label=repr(args[0])))
        if kind == "empty_cache" and not args:
            return Op("empty_cache", text=msg("empty_cache"))
        if kind == "record_stream" and len(args) == 2:
            stream = _int(args[1], where, "stream")
            return Op("record_stream", 0, stream, args[0], msg("record_stream", label=repr(args[0]), stream=stream))
        if kind == "synchronize" and len(args) <= 1:
            stream = _int(args[0], where, "stream") if args else None
            text = msg("synchronize_stream", stream=stream) if args else msg("synchronize")
            return Op("synchronize", 0, stream, None, text)
        raise VizInputError(
            f"{where}: cannot read {ev!r}; the forms are ('malloc', size[, stream[, label]]), "
            "('free', label), ('empty_cache',), ('record_stream', label, stream), ('synchronize'[, stream]) "
            "and (size, stream, label)"
        )
    size = _int(head, where, "size")
    stream = _int(ev[1], where, "stream") if len(ev) > 1 else 0
    label = ev[2] if len(ev) > 2 else index
    if len(ev) > 3 or size == 0 or stream < 0:
        raise VizInputError(f"{where}: expected (size, stream, label), size != 0 and stream >= 0, got {ev!r}")
    if size > 0:
        return _malloc(size, stream, label)
    return Op("free", 0, None, label, msg("free", label=repr(label)))


def _reduce_lock(lock: Any) -> tuple[Any, tuple[()]]:
    return (threading.RLock if "RLock" in type(lock).__name__ else threading.Lock), ()


def freeze(obj: Any) -> bytes:
    """Pickle an allocator (or anything holding one) for a checkpoint. Locks cannot be pickled: this pickler,
    and only this one, writes each as a fresh lock. Bytes rather than a deep copy: ten times faster to make
    and to restore, and a hundred checkpoints leave no objects for the garbage collector to walk."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = copyreg.dispatch_table.copy()
    for lock in (threading.Lock(), threading.RLock()):
        pickler.dispatch_table[type(lock)] = _reduce_lock
    pickler.dump(obj)
    return buf.getvalue()


@dataclass
class _State:
    allocator: CachingAllocator
    ptrs: dict[Any, int]  # label -> address of its live block
    failed: set[Any]  # labels whose malloc ran out of memory
    outcome: Message | str = ("start", ())  # what the last event did, as a message (see describe)


class Replay:
    """An allocator that can be moved to any step of an event list, quickly, forward and backward."""

    def __init__(self, events: Iterable[Any], config: Any = None, *, capacity: int | str = "80GiB",
                 checkpoint_every: int = 1000, start_segments: list[dict[str, Any]] | None = None,
                 trace_ops: Sequence[tuple] | None = None) -> None:
        every = checkpoint_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise VizInputError(f"checkpoint_every must be a positive int, got {checkpoint_every!r}")
        self._start = start_segments or []
        live = [b["address"] for s in self._start for b in s["blocks"] if b["state"] == "active_allocated"]
        # plain tuples: the collector stops tracking a tuple of plain values, but never a NamedTuple's
        self._ops = [tuple(op) for op in normalize_events(events, live, trace_ops)]
        self.config = config if config is not None else ""  # "" and not None: never read the environment
        self.capacity = capacity
        self.every = checkpoint_every
        self.position = 0
        self._ooms: set[int] = set()
        self._state = self._fresh()
        self._cloneable = True
        self._checkpoints: dict[int, bytes] = {}  # step -> frozen _State
        self._checkpoint()

    def __len__(self) -> int:
        return len(self._ops)

    @property
    def ops(self) -> list[Op]:
        """The normalised events."""
        return [Op._make(t) for t in self._ops]

    @property
    def ooms(self) -> list[int]:
        """Steps whose malloc ran out of memory, of those replayed so far (all of them after precompute)."""
        return sorted(self._ooms)

    @property
    def allocator(self) -> CachingAllocator:
        return self._state.allocator

    @property
    def outcome(self) -> str:
        """What the event that led to the current step did (an OOM says so), in the notebook's language."""
        return describe(self._state.outcome)

    @classmethod
    def from_snapshot(cls, source: Any, device: int = 0, *, config: Any = None, capacity: int | str | None = None,
                      checkpoint_every: int = 1000) -> Replay:
        """A replay of a snapshot's trace (a dict or a pickle's path) from the state at its first entry, rebuilt
        at the recorded addresses, under the run's own settings unless `config` is given."""
        from ..replay import unlimited_capacity

        snap = source if isinstance(source, dict) else load_snapshot(source)
        trace = read_device_trace(snap, device, str(source) if not isinstance(source, dict) else "<snapshot>")
        return cls(trace.entries, recorded_config(snap) if config is None else config,
                   capacity=unlimited_capacity(trace) if capacity is None else capacity,
                   checkpoint_every=checkpoint_every, start_segments=trace.start_segments, trace_ops=trace.ops)

    def _fresh(self) -> _State:
        allocator = CachingAllocator(SimulatedGPU(self.capacity), self.config)
        allocator.record_memory_history(False)
        if not self._start:
            return _State(allocator, {}, set())
        allocator.restore_segments(self._start)
        live = {b["address"]: b["address"] for s in self._start for b in s["blocks"]
                if b["state"] == "active_allocated"}
        return _State(allocator, live, set(), msg("start_trace"))

    def _checkpoint(self) -> None:
        if not self._cloneable or self.position in self._checkpoints:
            return
        try:
            self._checkpoints[self.position] = freeze(self._state)
        except (TypeError, AttributeError, pickle.PicklingError):
            # something unpicklable (a label, a new allocator field): backward moves replay from step 0
            self._cloneable = False
            self._checkpoints.clear()

    def _apply(self, op: Op) -> Message | str:
        st = self._state
        a = st.allocator
        if op.kind == "malloc":
            try:
                st.ptrs[op.label] = a.malloc(op.size, op.stream or 0)
                return op.text
            except OutOfMemoryError as e:
                st.failed.add(op.label)
                self._ooms.add(self.position + 1)
                return msg("oom", what=op.text, size=format_size(e.report.alloc_size))
        if op.kind in ("free", "record_stream") and op.label in st.failed:
            if op.kind == "free":
                st.failed.discard(op.label)
            return msg("skipped", what=op.text)
        if op.kind == "free":
            a.free(st.ptrs.pop(op.label))
        elif op.kind == "record_stream":
            a.record_stream(st.ptrs[op.label], op.stream or 0)
        elif op.kind == "empty_cache":
            a.empty_cache()
        elif op.kind == "release":  # as minialloc.replay: the run's segments (a mapped range's retry unmaps alone)
            for segment in op.label:
                if segment > 0 and not a.release_cached_segment(segment):
                    break  # not a wholly free segment here: the replay has left the run
        elif op.kind == "synchronize":
            a.device.synchronize(op.stream)
            a.process_events()
        return op.text

    def goto(self, n: int) -> CachingAllocator:
        """Move to the state after the first n events and return the allocator (it changes with the next
        move: take a snapshot to keep a state)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(self._ops):
            raise VizInputError(f"step must be an int in [0, {len(self._ops)}], got {n!r}")
        base = max((k for k in self._checkpoints if k <= n), default=0)
        if n < self.position or base > self.position:
            # backward, or a checkpoint lies ahead of us: start from it rather than replaying up to it
            frozen = self._checkpoints.get(base)
            self._state = pickle.loads(frozen) if frozen is not None else self._fresh()
            self.position = base
        while self.position < n:
            self._step()
        return self._state.allocator

    def _step(self) -> None:
        self._state.outcome = self._apply(Op._make(self._ops[self.position]))
        self.position += 1
        if self.position % self.every == 0:
            self._checkpoint()

    def precompute(self) -> np.ndarray:
        """Replay every event once, leaving a checkpoint every `checkpoint_every` events, and return the
        (allocated, reserved) bytes after each step, an array of shape (steps + 1, 2): the key frames come
        from it, and it can be drawn with plot_timeline(list(map(tuple, samples)))."""
        from ..replay import progress_bar  # tqdm.auto: a widget in JupyterLab, a bar on a terminal, nothing in a pipe

        here = self.position
        a = self.goto(0)
        samples = np.zeros((len(self._ops) + 1, 2), dtype=np.int64)
        samples[0] = a.memory_allocated(), a.memory_reserved()
        # a long trace takes seconds: say so; a chapter's few dozen events need no bar
        bar = progress_bar(len(self._ops), "stepping through the trace") if len(self._ops) >= PROGRESS_EVENTS else None
        while self.position < len(self._ops):
            self._step()
            a = self._state.allocator
            samples[self.position] = a.memory_allocated(), a.memory_reserved()
            if bar is not None and self.position % 2048 == 0:
                bar.update_to(self.position)
        if bar is not None:
            bar.close()
        self.goto(here)
        return samples


def random_events(n: int, *, seed: int = 0, streams: int = 2) -> list[tuple[int, int, str]]:
    """A synthetic training-like workload of n (size, stream, label) events, for demos and benchmarks: layer
    activations that live for a while, short-lived temporaries, some of them on a side stream."""
    rng = random.Random(seed)
    events: list[tuple[int, int, str]] = []
    live: list[tuple[int, str]] = []
    sizes = [512, 4096, 65_536, 300_000, 1 * MiB, 3 * MiB, 6 * MiB, 12 * MiB, 25 * MiB, 60 * MiB]
    while len(events) < n:
        grow = len(live) < 8 or (rng.random() < 0.52 and len(live) < 400)
        if grow or not live:
            size = rng.choice(sizes) + rng.randrange(0, 4) * 512
            stream = 0 if rng.random() < 0.85 else rng.randrange(streams)
            label = f"t{len(events)}"
            live.append((stream, label))
            events.append((size, stream, label))
        else:
            stream, label = live.pop(rng.randrange(len(live)) if rng.random() < 0.5 else -1)
            events.append((-1, stream, label))
    return events


