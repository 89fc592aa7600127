"""Several ranks at once: one table across the OOM snapshots a trainer writes per rank (oom_rank{N}.pickle).

FSDP and Megatron jobs dump one snapshot per rank when one of them runs out of memory. `minialloc diagnose
rank0.pickle rank1.pickle ...` (or a folder of them) reads each file's own state, with no replay, so it is quick
on many files: reserved, allocated, cached free (reserved but unallocated), the largest cached free block,
fragmentation (1 - largest free block / cached free) and the top holder (the user frame holding most live bytes,
when the blocks carry stacks). The rank that failed is the one whose trace has an 'oom' entry; the report says
how its figures differ from the median of the others.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .diagnose import diagnose_state, holder_name
from .lang import messages, say
from .sizes import readable_size
from .trace import TraceError, devices, read_snapshot

# The table and the verdict in the notebook's (or MINIALLOC_LANG's) language; as_dict (the JSON) keeps English.
TEXT = messages("minialloc.ranks.TEXT", {
    "no_failure": "no rank's trace has an oom entry: none of these snapshots records a failure",
    "all_failed": "every rank's trace has an oom entry ({failed} of {ranks}): nothing to compare them with",
    "reserved": "reserved",
    "allocated": "allocated",
    "cached_free": "cached free",
    "largest_free_block": "largest free block",
    "same_holder": "the same top holder as the others",
    "top_holder": "top holder {holder} ({size})",
    "failed": "rank {rank} (device {device}) failed; against the median of the {others} others: {parts}; {holder}",
    "col_rank": "rank",
    "col_device": "dev",
    "col_reserved": "reserved",
    "col_allocated": "allocated",
    "col_cached_free": "cached free",
    "col_largest_free": "largest free",
    "col_fragmentation": "frag",
    "col_top_holder": "top holder",
})

__all__ = ["RankState", "rank_files", "rank_states", "rank_table", "rank_verdict"]


@dataclass
class RankState:
    rank: int
    file: str
    device: int
    reserved: int
    allocated: int
    cached_free: int
    largest_free_block: int
    fragmentation: float
    top_holder: str
    top_holder_bytes: int
    failed: bool  # its trace has an 'oom' entry

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fragmentation": round(self.fragmentation, 4)}


def rank_files(paths: list[str]) -> list[Path]:
    """The snapshot files named, a folder standing for its *.pickle files (sorted by rank number, then name)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.pickle"))
            if not found:
                raise TraceError(f"{p}: a folder with no .pickle file in it (expected one snapshot per rank)")
            out += found
        else:
            out.append(p)
    return sorted(out, key=lambda f: (_rank_number(f) is None, _rank_number(f) or 0, f.name))


def _rank_number(path: Path) -> int | None:
    """The rank a file name gives (oom_rank3.pickle, rank_3.pickle, snapshot_r3.pickle), if any."""
    m = re.search(r"(?:rank|_r)[_-]?(\d+)", path.stem, re.IGNORECASE)
    return int(m.group(1)) if m else None


def rank_states(paths: list[Path]) -> list[RankState]:
    """One row per file and device that holds segments; a file without a rank number gets its position."""
    rows = []
    for k, path in enumerate(paths):
        snap = read_snapshot(path)
        traces = snap.get("device_traces") or []
        for device in devices(snap):
            d = diagnose_state(snap, device, "")
            top = d.holders[0] if d.holders else None
            failed = device < len(traces) and any(e.get("action") == "oom" for e in traces[device])
            rank = _rank_number(path)
            rows.append(RankState(k if rank is None else rank, str(path), device, d.reserved, d.allocated,
                                  d.cached_free, d.largest_cached_free_block,
                                  1 - d.largest_cached_free_block / d.cached_free if d.cached_free else 0.0,
                                  top.frame if top else "-", top.bytes if top else 0, failed))
    if not rows:
        raise TraceError("none of the files holds a segment: nothing to compare")
    return rows


def rank_verdict(rows: list[RankState]) -> str:
    """Which rank failed and how it differs from the median of the others (every figure read from the files)."""
    failed = [r for r in rows if r.failed]
    others = [r for r in rows if not r.failed]
    if not failed:
        return say(TEXT, "no_failure")
    if not others:
        return say(TEXT, "all_failed", failed=len(failed), ranks=len(rows))
    lines = []
    for r in failed:
        parts = []
        for key in ("reserved", "allocated", "cached_free", "largest_free_block"):
            mine, median = getattr(r, key), int(statistics.median(getattr(o, key) for o in others))
            sign = "+" if mine >= median else "-"
            parts.append(f"{say(TEXT, key)} {readable_size(mine)} ({sign}{readable_size(abs(mine - median))})")
        top = {o.top_holder for o in others}
        holder = (say(TEXT, "same_holder") if top == {r.top_holder}
                  else say(TEXT, "top_holder", holder=holder_name(r.top_holder),
                           size=readable_size(r.top_holder_bytes)))
        lines.append(say(TEXT, "failed", rank=r.rank, device=r.device, others=len(others), parts=", ".join(parts),
                         holder=holder))
    return "\n".join(lines)


def rank_table(rows: list[RankState]) -> str:
    keys = ("rank", "device", "reserved", "allocated", "cached_free", "largest_free", "fragmentation")
    head = [say(TEXT, f"col_{key}") for key in keys]
    # a heading longer in the notebook's language widens its column
    widths = [max(w, len(h)) for w, h in zip((4, 3, 11, 11, 11, 12, 5), head, strict=True)]
    out = [" ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)) + "  " + say(TEXT, "col_top_holder")]
    for r in rows:
        cells = (str(r.rank), str(r.device), readable_size(r.reserved), readable_size(r.allocated),
                 readable_size(r.cached_free), readable_size(r.largest_free_block), f"{r.fragmentation:.0%}")
        out.append(" ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
                   + f"  {holder_name(r.top_holder)} ({readable_size(r.top_holder_bytes)})"
                   + ("  <- OOM" if r.failed else ""))
    return "\n".join(out)
