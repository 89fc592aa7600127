"""From a snapshot to rows: the segment map's model, with no drawing in it.

A row is one segment, or the mapped ranges of one expandable reservation; its pieces are blocks (and unmapped
gaps) at offsets from the row's start. Expandable grouping: from an allocator the reserved ranges are known
exactly; from a snapshot alone, consecutive expandable segments of one device, stream and pool are taken to
share a reservation when the gap between them is a whole number of that pool's pages (2 MiB small, 20 MiB
large), as ExpandableSegment maps whole pages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..sizes import MiB

_PAGE = {"small": 2 * MiB, "large": 20 * MiB}  # expandable page size per pool (ExpandableSegment)


@dataclass
class Piece:
    """A stretch of a row: one block, or an unmapped gap. offset counts from the row's start."""

    offset: int
    size: int
    kind: str
    address: int


@dataclass
class Row:
    """One bar: a segment, or the mapped ranges of one expandable reservation."""

    address: int
    extent: int  # bytes from the row's start to the end of its last block
    reserved: int  # mapped bytes
    pieces: list[Piece]
    stream: int
    pool: str
    expandable: bool
    ranges: int  # snapshot segments drawn on this row
    device: int = 0

    def bytes_of(self, kind: str) -> int:
        return sum(p.size for p in self.pieces if p.kind == kind)


# -- from snapshot to rows -----------------------------------------------------------------------------------
def _kind(state: str, segment_active: bool) -> str:
    if state == "active_allocated":
        return "live"
    if state == "active_pending_free":
        return "pending"
    return "free_split" if segment_active else "free_whole"


def _add_segment(row_pieces: list[Piece], segment: dict[str, Any], offset: int) -> None:
    blocks = segment["blocks"]
    active = any(b["state"] != "inactive" for b in blocks)
    address = segment["address"]
    for b in blocks:
        row_pieces.append(Piece(offset, b["size"], _kind(b["state"], active), b.get("address", address)))
        offset += b["size"]
        address += b["size"]


def _group_key(s: dict[str, Any]) -> tuple:
    pool_id = tuple(s.get("segment_pool_id", (0, 0)))
    return (s.get("device", 0), s["stream"], s.get("segment_type", "large"), pool_id)


def segment_rows(snapshot: dict[str, Any], reservations: list[tuple[int, int]] | None = None) -> list[Row]:
    """The snapshot's segments as rows, in address order; expandable ranges grouped per reservation."""
    rows: list[Row] = []
    expandable: list[dict[str, Any]] = []
    for s in snapshot.get("segments", []):
        if s.get("is_expandable"):
            expandable.append(s)
            continue
        pieces: list[Piece] = []
        _add_segment(pieces, s, 0)
        rows.append(Row(s["address"], s["total_size"], s["total_size"], pieces, s["stream"],
                        s.get("segment_type", "large"), False, 1, s.get("device", 0)))

    def reservation_of(address: int) -> tuple[int, int] | None:
        for start, size in reservations or ():
            if start <= address < start + size:
                return start, size
        return None

    groups: list[list[dict[str, Any]]] = []
    for s in sorted(expandable, key=lambda s: (_group_key(s), s["address"])):
        if groups and _group_key(groups[-1][-1]) == _group_key(s):
            last = groups[-1][-1]
            here = reservation_of(s["address"])
            if here is not None:
                same = here == reservation_of(last["address"])
            else:
                gap = s["address"] - (last["address"] + last["total_size"])
                same = gap >= 0 and gap % _PAGE.get(s.get("segment_type", "large"), 20 * MiB) == 0
            if same:
                groups[-1].append(s)
                continue
        groups.append([s])
    for group in groups:
        first = group[0]
        known = reservation_of(first["address"])
        start = known[0] if known else first["address"]
        pieces = []
        cursor = start
        for s in group:
            if s["address"] > cursor:
                pieces.append(Piece(cursor - start, s["address"] - cursor, "unmapped", cursor))
            _add_segment(pieces, s, s["address"] - start)
            cursor = s["address"] + s["total_size"]
        rows.append(Row(start, cursor - start, sum(s["total_size"] for s in group), pieces, first["stream"],
                        first.get("segment_type", "large"), True, len(group), first.get("device", 0)))
    rows.sort(key=lambda r: (r.device, r.address))
    return rows


def largest_free(rows: list[Row]) -> tuple[int, Piece] | None:
    """(row index, piece) of the largest cached free block; the lowest address wins a tie, as best fit would."""
    best: tuple[int, Piece] | None = None
    for i, row in enumerate(rows):
        for p in row.pieces:
            if p.kind in ("free_split", "free_whole") and (
                best is None or (p.size, -p.address) > (best[1].size, -best[1].address)
            ):
                best = (i, p)
    return best


def merge_runs(pieces: list[Piece]) -> list[tuple[int, int, str, list[int]]]:
    """Merge adjacent pieces of one kind: (offset, size, kind, inner boundaries)."""
    runs: list[tuple[int, int, str, list[int]]] = []
    for p in pieces:
        if runs and runs[-1][2] == p.kind and runs[-1][0] + runs[-1][1] == p.offset:
            off, size, kind, cuts = runs[-1]
            cuts.append(p.offset)
            runs[-1] = (off, size + p.size, kind, cuts)
        else:
            runs.append((p.offset, p.size, p.kind, []))
    return runs


def select_rows(rows: list[Row], max_rows: int) -> tuple[list[Row], list[Row]]:
    """Rows to draw and rows to sum up. All of them in address order when they fit; else the largest first."""
    if len(rows) <= max_rows:
        return rows, []
    keep_n = max(1, max_rows - 1)  # one row goes to the summary
    order = sorted(rows, key=lambda r: (-r.reserved, r.address))
    keep, rest = order[:keep_n], order[keep_n:]
    found = largest_free(rows)
    if found is not None and rows[found[0]] in rest:
        # the largest cached free block is the map's headline: never hide it in the summary
        promoted = rows[found[0]]
        rest.remove(promoted)
        rest.append(keep.pop())
        keep.append(promoted)
        keep.sort(key=lambda r: (-r.reserved, r.address))
    return keep, rest


def auto_wrap(extents: list[int], max_rows: int) -> int | None:
    """A line length for rows far longer than the others (a grown expandable segment beside ordinary ones), so
    that every row stays readable on one byte scale: long rows continue on further lines, like text."""
    if len(extents) < 2:
        return None
    ordered = sorted(extents)
    median, longest = ordered[(len(ordered) - 1) // 2], ordered[-1]  # the lower median: 2 rows, the shorter
    if longest <= 8 * median:
        return None
    wrap = max(4 * median, -(-longest // max(2, max_rows // 3)))
    if wrap < MiB:
        return wrap
    # up to a round number of MiB (250, 300, 400, ...), so that line starts read easily
    mib = wrap / MiB
    power = 10 ** math.floor(math.log10(mib))
    return int(next(f * power for f in (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if f * power >= mib) * MiB)


@dataclass
class Line:
    row: int  # index into the drawn rows
    start: int  # offset in the row where this line begins
    length: int


def wrap_lines(rows: list[Row], wrap: int | None) -> list[Line]:
    lines = []
    for i, row in enumerate(rows):
        step = wrap if wrap else max(row.extent, 1)
        for start in range(0, max(row.extent, 1), step):
            lines.append(Line(i, start, min(step, row.extent - start)))
    return lines


def fit_rows(
    rows: list[Row], rest: list[Row], wrap: int | None, max_rows: int
) -> tuple[list[Row], list[Row]]:
    """Move the smallest drawn rows to the summary until their lines (a wrapped row takes several) fit."""
    if wrap is None:
        return rows, rest
    rows, rest = list(rows), list(rest)
    found = largest_free(rows)
    headline = rows[found[0]] if found else None
    while len(rows) > 1 and len(wrap_lines(rows, wrap)) + (1 if rest else 0) > max_rows:
        victim = min((r for r in rows if r is not headline), key=lambda r: (r.reserved, -r.address))
        rows.remove(victim)
        rest.append(victim)
    return rows, rest


