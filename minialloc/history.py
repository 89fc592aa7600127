"""Memory history: the trace ring buffer that torch.cuda.memory._record_memory_history switches on.

The allocator holds one History while history is recorded and None otherwise, so its hot path tests one
attribute when nothing is recorded (PyTorch's record_history flag). While it is on, malloc, free and the segment
functions call History.record at the points where DeviceCachingAllocator calls record_trace; snapshot() turns
the entries into PyTorch's dicts (snapshot_writer.py).

Entries are kept as tuples, not dicts: building a dict per malloc and free would make recording measurably slower
(bench/replay.py, history on), and most entries are never read.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Iterable

__all__ = ["DEFAULT_TRACE_ENTRIES", "History", "clock_past", "python_frames"]

DEFAULT_TRACE_ENTRIES = sys.maxsize  # _record_memory_history's max_entries default (torch/cuda/memory.py, 2.13)


def python_frames(limit: int = 16) -> list[dict]:
    """The caller's Python stack as snapshot frames ({filename, line, name}), minialloc's own frames skipped."""
    frames = []
    f = sys._getframe(1)
    while f is not None and len(frames) < limit:
        code = f.f_code
        if "/minialloc/" not in code.co_filename.replace("\\", "/"):
            frames.append({"filename": code.co_filename, "line": f.f_lineno, "name": code.co_name})
        f = f.f_back
    return frames


def clock_past(t: int) -> int:
    """The microsecond clock once it reads later than t (at most a microsecond's wait), so that an annotation
    never shares its time with a trace entry written before or after it."""
    now = time.time_ns() // 1000
    while now <= t:
        now = time.time_ns() // 1000
    return now


class History:
    """The recorded trace (PyTorch's alloc_buffer ring), whether stacks are kept, the user_metadata written into
    each entry, and the snapshot's external annotations."""

    def __init__(self, max_entries: int, stacks: bool, note: str, entries: Iterable[tuple] = (),
                 annotations: list[dict] | None = None) -> None:
        self.entries: deque[tuple] = deque(entries, maxlen=max_entries)
        self.stacks = stacks  # also keep each allocation's Python stack (record_context_ ALL)
        self.note = note  # user_metadata (torch.cuda.memory._set_memory_metadata)
        self.annotations: list[dict] = [] if annotations is None else annotations

    @staticmethod
    def switched(old: History | None, enabled: bool | str | None, max_entries: int, stacks: bool,
                 clear_history: bool, note: str) -> History | None:
        """The history after _record_memory_history(enabled, max_entries, stacks, clear_history): None when
        switched off (recordHistory(false) clears the buffer), else a ring of max_entries that keeps what was
        recorded so far unless clear_history."""
        if enabled not in (True, False, None, "all", "state"):
            raise ValueError(f"enabled must be 'all', 'state', None, True or False, got {enabled!r}")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
        if enabled in (False, None):
            return None
        if old is None or clear_history:
            return History(max_entries, stacks, note)
        return History(max_entries, stacks, note, old.entries, old.annotations)

    def record(self, action: str, addr: int, size: int, stream: int, frames: list | None = None) -> None:
        """record_trace. Hot-path callers pass `block.frames or None`: an empty list kept alive by every entry of an
        unbounded ring buffer costs memory and garbage-collector time."""
        self.entries.append((action, addr, size, stream, time.time_ns() // 1000, frames, self.note))

    def context(self) -> list[dict] | None:
        """The stack PyTorch attaches to segment and oom entries (the malloc's or free's context) when stacks are
        recorded; None otherwise. Not on the per-block hot path: segments come and go rarely."""
        return python_frames() if self.stacks else None

    def last_us(self) -> int:
        return self.entries[-1][4] if self.entries else 0

    def annotate(self, name: str, stage: str, device: int) -> int:
        """An external annotation, in the form PyTorch's record_function annotations take in a snapshot, later
        than every entry so far; returns its time."""
        time_us = clock_past(self.last_us())
        self.annotations.append({"name": name, "stage": stage, "device": device, "time_us": time_us})
        return time_us

    def trace(self) -> list[dict]:
        """The entries as PyTorch writes them (torch/csrc/cuda/memory_snapshot.cpp): these keys in this order,
        the address named device_free in oom entries, frames only when a stack was recorded."""
        out = []
        for action, addr, size, stream, time_us, frames, note in self.entries:
            entry = {"action": action, "device_free" if action == "oom" else "addr": addr, "size": size,
                     "stream": stream, "time_us": time_us, "compile_context": "N/A", "user_metadata": note}
            if frames:
                entry["frames"] = list(frames)
            out.append(entry)
        return out
