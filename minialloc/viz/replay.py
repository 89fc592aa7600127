"""Replay a list of events through a CachingAllocator, and move to any step of it quickly.

Events, replayed through a CachingAllocator on a SimulatedGPU built from a config:

    (size, stream, label)          size > 0: malloc(size, stream), the block named `label`;
                                   size < 0: free the live block named `label`
    (size, stream) or (size,)      the same, named by the event's index (so only a malloc)
    ("malloc", size[, stream[, label]])   ("free", label)   ("empty_cache",)
    ("record_stream", label, stream)      ("synchronize"[, stream])
    trace entry dicts              a snapshot's device_traces: alloc -> malloc, free_requested -> free,
                                   and a run of segment releases outside any malloc -> empty_cache; the
                                   other entries the allocator makes itself (segment_*, free_completed,
                                   oom, snapshot) are left out, since the replay makes its own. A trace has
                                   no record_stream, so its replay frees every block at once; and the
                                   replay starts empty, so frees of blocks allocated before a trace cut
                                   short by its ring buffer began are dropped.

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
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..allocator import CachingAllocator
from ..device import SimulatedGPU
from ..oom import OutOfMemoryError
from ..sizes import MiB, format_size
from ..workloads import Event
from ._common import VizInputError


class Op(NamedTuple):
    """One normalised event: kind is malloc, free, empty_cache, record_stream or synchronize.

    Replay keeps them as plain tuples: a tuple of plain values drops out of the garbage collector's sight, and
    a 100,000-event replay would otherwise add 100,000 objects to walk in every full collection."""

    kind: str
    size: int = 0
    stream: int | None = 0
    label: Any = None
    text: str = ""


def _int(value: Any, where: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise VizInputError(f"{where}: {what} must be an int, got {value!r}")
    return value


_RELEASES = ("segment_free", "segment_unmap")
_GROWS = ("segment_alloc", "segment_map", "oom")


def _empty_cache_points(events: list[Any]) -> set[int]:
    """Indices of trace entries that end an empty_cache: a trace records the segments it released, not the
    call. Releases made inside malloc (the OOM retry path, garbage collection) are always followed by the
    malloc's own segment_alloc, segment_map or oom; releases followed by anything else were an empty_cache."""
    points: set[int] = set()
    last_release: int | None = None
    for i, ev in enumerate(events):
        action = ev.get("action") if isinstance(ev, dict) else None
        if action in _RELEASES:
            last_release = i
        elif action in ("free_completed", "snapshot"):
            continue
        elif last_release is not None:
            if action not in _GROWS:
                points.add(last_release)
            last_release = None
    if last_release is not None:
        points.add(last_release)
    return points


def normalize_events(events: Iterable[Any]) -> list[Op]:
    """Turn any accepted event form into Ops, checking that every free names a block live at that point."""
    events = list(events)
    empty_cache_after = _empty_cache_points(events)
    ops: list[Op] = []
    live: set[Any] = set()
    for i, ev in enumerate(events):
        where = f"events[{i}]"
        op = _one(ev, where, len(ops))
        if i in empty_cache_after:
            op = Op("empty_cache", text="empty_cache() (its releases are in the trace)")
        if op is None:
            continue
        if isinstance(ev, dict) and op.kind == "free" and op.label not in live:
            continue  # a trace cut short by its ring buffer frees blocks allocated before it began
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
    return Op("malloc", size, stream, label, f"malloc {format_size(size)} on stream {stream} as {label!r}")


def _one(ev: Any, where: str, index: int) -> Op | None:
    if isinstance(ev, Event):  # minialloc.workloads' events, as generated or read from a trace
        if ev.op == "alloc":
            op = _malloc(_int(ev.size, where, "size"), _int(ev.stream, where, "stream"), ev.name)
            return Op(op.kind, op.size, op.stream, op.label, ev.label or op.text)
        if ev.op == "free":
            return Op("free", 0, None, ev.name, f"free {ev.name!r}")
        if ev.op == "empty_cache":
            return Op("empty_cache", text="empty_cache()")
        raise VizInputError(f"{where}: unknown op {ev.op!r} (alloc, free or empty_cache)")
    if isinstance(ev, dict):
        action = ev.get("action")
        if action == "alloc":
            size, stream = _int(ev.get("size"), where, "size"), _int(ev.get("stream", 0), where, "stream")
            return Op("malloc", size, stream, ev.get("addr"), f"alloc {format_size(size)} on stream {stream}")
        if action == "free_requested":
            return Op("free", 0, None, ev.get("addr"), f"free {format_size(ev.get('size', 0))}")
        if action in ("free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap",
                      "snapshot", "oom"):
            return None
        raise VizInputError(f"{where}.action: unknown trace action {action!r}")
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
            return Op("free", 0, None, args[0], f"free {args[0]!r}")
        if kind == "empty_cache" and not args:
            return Op("empty_cache", text="empty_cache()")
        if kind == "record_stream" and len(args) == 2:
            stream = _int(args[1], where, "stream")
            return Op("record_stream", 0, stream, args[0], f"record_stream({args[0]!r}, stream {stream})")
        if kind == "synchronize" and len(args) <= 1:
            stream = _int(args[0], where, "stream") if args else None
            text = f"synchronize(stream {stream})" if args else "synchronize()"
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
    return Op("free", 0, None, label, f"free {label!r}")


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
    outcome: str = "start: nothing allocated"  # what the last event did


class Replay:
    """An allocator that can be moved to any step of an event list, quickly, forward and backward."""

    def __init__(self, events: Iterable[Any], config: Any = None, *, capacity: int | str = "80GiB",
                 checkpoint_every: int = 1000) -> None:
        every = checkpoint_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise VizInputError(f"checkpoint_every must be a positive int, got {checkpoint_every!r}")
        # plain tuples: the collector stops tracking a tuple of plain values, but never a NamedTuple's
        self._ops = [tuple(op) for op in normalize_events(events)]
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
        """What the event that led to the current step did (an OOM says so)."""
        return self._state.outcome

    def _fresh(self) -> _State:
        allocator = CachingAllocator(SimulatedGPU(self.capacity), self.config)
        allocator.record_memory_history(False)
        return _State(allocator, {}, set())

    def _checkpoint(self) -> None:
        if not self._cloneable or self.position in self._checkpoints:
            return
        try:
            self._checkpoints[self.position] = freeze(self._state)
        except (TypeError, AttributeError, pickle.PicklingError):
            # something unpicklable (a label, a new allocator field): backward moves replay from step 0
            self._cloneable = False
            self._checkpoints.clear()

    def _apply(self, op: Op) -> str:
        st = self._state
        a = st.allocator
        if op.kind == "malloc":
            try:
                st.ptrs[op.label] = a.malloc(op.size, op.stream or 0)
                return op.text
            except OutOfMemoryError as e:
                st.failed.add(op.label)
                self._ooms.add(self.position + 1)
                return f"{op.text}: OUT OF MEMORY (asked the device for {format_size(e.report.alloc_size)})"
        if op.kind in ("free", "record_stream") and op.label in st.failed:
            if op.kind == "free":
                st.failed.discard(op.label)
            return f"{op.text}: skipped, its malloc ran out of memory"
        if op.kind == "free":
            a.free(st.ptrs.pop(op.label))
        elif op.kind == "record_stream":
            a.record_stream(st.ptrs[op.label], op.stream or 0)
        elif op.kind == "empty_cache":
            a.empty_cache()
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
        here = self.position
        a = self.goto(0)
        samples = np.zeros((len(self._ops) + 1, 2), dtype=np.int64)
        samples[0] = a.memory_allocated(), a.memory_reserved()
        while self.position < len(self._ops):
            self._step()
            a = self._state.allocator
            samples[self.position] = a.memory_allocated(), a.memory_reserved()
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


