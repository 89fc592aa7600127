"""A what-if with bounds, for a trace that starts mid-run: each setting's peak reserved as a range, the point
estimate inside it, and a verdict that follows from the range.

A mid-run file cannot say what a setting would have done before its first entry, so the re-laid estimate
(minialloc.relay) is one guess among those the file allows. The range says how far that guess can be off:

- low: reserved memory is never less than the blocks it holds, and every block is at least its request rounded
  by the setting's own round_size. So the largest sum of rounded requests live at once, from the first entry on
  (the blocks live there, then the trace's), is a floor no run under that setting goes below.
- high: the run under the setting held, at the first entry, at most what the recorded run held there plus what
  the re-laid start holds (the recorded segments kept whole, and the setting's own layout of the same blocks
  beside them: max_split_size_mb's unsplit oversize blocks, made by requests the file does not show, are what a
  smaller ceiling misses); after it, the trace needs no more new memory than it needs replayed from an empty GPU
  under the setting (every cached block of the start, and every block the start frees, left unused). The sum is
  the ceiling. It is an assumption about the part of the run the file does not show, not a proof:
  bench/relaid_whatif.py checks it on cuts of runs traced from their start (the truth inside in 39 of 40; the
  miss is max_split_size_mb's cache, which grows with every oversize request size made before the cut), and
  tests/test_bounds.py on every cut of the project's smaller from-start traces.
- Under the recorded settings the as-recorded replay is exact: the range is that one figure.

The verdict on a device of `capacity` bytes: "saved" when even the ceiling fits, "not saved" when even the floor
does not, and "cannot tell from this file" in between.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .allocator import round_size
from .config import AllocatorConfig
from .replay import replay_trace
from .trace import FREE, MALLOC, DeviceTrace

SAVED, NOT_SAVED, CANNOT_TELL = "saved", "not saved", "cannot tell from this file"


@dataclass
class PeakRange:
    """One setting's peak reserved from the first entry on: a floor, the re-laid estimate, a ceiling."""

    config: str
    low: int
    estimate: int
    high: int
    exact: bool = False  # the recorded settings: the as-recorded replay itself

    def verdict(self, capacity: int) -> str:
        """Whether a run under this setting fits on a device of `capacity` bytes, as far as the range tells."""
        if self.high <= capacity:
            return SAVED
        if self.low > capacity:
            return NOT_SAVED
        return CANNOT_TELL

    @property
    def width(self) -> float:
        """The range as a share of its floor (0 for an exact one)."""
        return (self.high - self.low) / self.low if self.low else 0.0


def rounded_live_peak(trace: DeviceTrace, config: str) -> int:
    """The most bytes of rounded requests live at once, from the first entry on (the floor of peak reserved)."""
    conf = AllocatorConfig.parse(config)
    divisions = any(conf.roundup_power2_divisions)

    def rounded(size: int) -> int:
        return round_size(size, conf.roundup_divisions_for(size) if divisions else 0)

    live = {addr: rounded(size) for addr, size in trace.live_at_start.items()}
    now = peak = sum(live.values())
    for kind, _, size, _, addr, _ in trace.ops:
        if kind == MALLOC:
            live[addr] = rounded(size)
            now += live[addr]
            peak = max(peak, now)
        elif kind == FREE and addr in live:
            now -= live.pop(addr)
    return peak


def peak_range(trace: DeviceTrace, config: str, recorded: str) -> PeakRange:
    """The range of `config`'s peak reserved for `trace` (see the module docstring); recorded: the run's own
    settings (trace.recorded_config), whose range is exact."""
    if config == recorded:
        exact, _ = replay_trace(trace, config, at_recorded=True)
        return PeakRange(config or "native", exact.peak_reserved, exact.peak_reserved, exact.peak_reserved, True)
    relaid, _ = replay_trace(trace, config, relaid=True)
    _, start = replay_trace(trace, config, relaid=True, until=0)  # the re-laid start alone
    empty = replace(trace, start_segments=[], reserved_at_start=0, from_empty=True)
    after, _ = replay_trace(empty, config)
    low = rounded_live_peak(trace, config)
    high = trace.reserved_at_start + start.memory_reserved() + after.peak_reserved
    high = max(high, low)
    return PeakRange(config or "native", low, min(max(relaid.peak_reserved, low), high), high)


__all__ = ["CANNOT_TELL", "NOT_SAVED", "SAVED", "PeakRange", "peak_range", "rounded_live_peak"]
