"""The segment map: every segment a horizontal bar drawn to scale, its blocks coloured by what they are.

Reading it: blue is memory a tensor holds; orange is free memory trapped inside a segment that also holds
live blocks (empty_cache cannot give it back, and a request bigger than the piece cannot use it); green is a
whole free segment (cached, returned by empty_cache); purple is freed memory still waiting on another stream;
grey hatching is address space of an expandable segment with no pages behind it. The largest CACHED free block
is outlined: the biggest request the cache can serve without asking the device for more. (The OOM message's
"largest free block" is the larger of this and what the device can still give; the map's title line shows the
device's free memory beside it, so both numbers are on the picture.)

Tiny blocks: a live or pending block narrower than MIN_BLOCK_FRACTION of the axis (a 512-byte tensor in a 2 MiB
segment) is drawn at that width (except in the dense rows described below), over its free neighbour, so that no
live memory hides; the x label says so whenever it happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from ..lang import messages
from ..sizes import MiB, format_size
from ._common import (
    KINDS,
    MARK_COLOR,
    OOM_COLOR,
    VizInputError,
    choose_unit,
    hide_spines,
    kind_legend,
    kind_style,
    new_figure,
    nothing_figure,
    resolve,
    say,
    short_size,
    titled,
)
from ._rows import (
    Line,
    Piece,
    Row,
    auto_wrap,
    fit_rows,
    largest_free,
    merge_runs,
    segment_rows,
    select_rows,
    wrap_lines,
)

RECT_BUDGET = 600  # rectangles per map before dense rows switch to collections
MIN_BLOCK_FRACTION = 1 / 160  # narrowest live block drawn, as a fraction of the axis: about 5 px on a course figure
ROW_HEIGHT = 0.62  # bar height, in row units (rows are 1 apart)
ROW_FRACTION = "fraction of the row"  # MapInfo.unit_name of a map drawn with scale="row"

# Every word the map writes, in English, shown in the notebook's language (minialloc.lang), chosen when it is drawn.
TEXT = messages("minialloc.viz.segment_map.TEXT", {
    "largest": "largest cached free block",
    "largest_size": "{largest}: {size}",
    "largest_outlined": "{largest} (outlined)",
    "request_outlined": "the request in question (outlined)",
    "request_label": "the {size} request",
    "request_missing": "the {size} request is not allocated here",
    "nothing": "no segments: nothing is reserved",
    "nothing_detail": "The allocator holds no memory from the device.",
    "nothing_free": " Device free: {free}.",
    "stats": "allocated {allocated} · reserved {reserved}",
    "stats_free": " · device free {free}",
    "xlabel": "offset in the segment",
    "wrapped": "rows longer than {size} continue on the next line (⋯)",
    "widened_one": "{n} tiny block drawn wider than to scale",
    "widened_many": "{n} tiny blocks drawn wider than to scale",
    "grouped_row": "+{n} smaller segments",
    "summary": "last row: {n} smaller segments (each at most {biggest}, {total} in all), summed by kind",
    "summary_scaled": ", drawn at 1/{factor} scale",
    "pool_large": "large",
    "pool_small": "small",
    "row": "{where}  {size} {pool}",
    "row_mapped": "{where}  {size} mapped, {pool}",
    "row_ranges": ", {n} ranges",
    "row_stream": ", stream {n}",
    "compact": "{size} {pool}{stream}",
    "compact_mapped": "{size} mapped {pool}{stream}",
    "native": "native",
    "expandable": "expandable segments",
})


@dataclass
class MapInfo:
    """What draw_segment_map drew: for the stepper, for tests, and for the notes under the map."""

    rows: list[Row]  # drawn rows, top to bottom (the summary row not included)
    grouped: int = 0  # segments summed into the summary row
    grouped_bytes: dict[str, int] = field(default_factory=dict)
    largest: tuple[int, Piece] | None = None  # (row index, piece) of the largest cached free block
    mark: tuple[int, float, float, int, float] | None = None  # where its label went: y, x, width, size, xmax
    unit: int = MiB
    unit_name: str = "MiB"
    xmax: float = 1.0
    allocated: int = 0
    reserved: int = 0
    kinds: set[str] = field(default_factory=set)
    widened: int = 0  # live or pending blocks drawn wider than to scale, so that they show
    request_found: bool | None = None  # with `request`: whether a live block of that requested size was drawn


# -- drawing -------------------------------------------------------------------------------------------------
def _pool(row: Row) -> str:
    return say(TEXT, f"pool_{row.pool}") if row.pool in ("large", "small") else row.pool


def _row_label(row: Row, streams: set[int], devices: set[int], compact: bool = False) -> str:
    if compact:  # what fits a quick frame: size, pool, stream
        stream = f" s{row.stream}" if len(streams) > 1 else ""
        return say(TEXT, "compact_mapped" if row.expandable else "compact", size=short_size(row.reserved),
                   pool=_pool(row), stream=stream)
    where = f"{row.address:#x}"
    if len(devices) > 1:
        where = f"cuda:{row.device} {where}"
    if row.expandable:
        text = say(TEXT, "row_mapped", where=where, size=short_size(row.reserved), pool=_pool(row))
        text += say(TEXT, "row_ranges", n=row.ranges) if row.ranges > 1 else ""
    else:
        text = say(TEXT, "row", where=where, size=short_size(row.extent), pool=_pool(row))
    return text + (say(TEXT, "row_stream", n=row.stream) if len(streams) > 1 else "")


def draw_segment_map(
    ax: Axes,
    source: Any,
    *,
    max_rows: int = 40,
    scale: str = "shared",
    wrap: int | str | None = "auto",
    xmax_bytes: int | None = None,
    device_free: int | None = None,
    title: str | None = None,
    min_rows: int = 1,
    compact: bool = False,
    request: int | None = None,
) -> MapInfo:
    """Draw a segment map into `ax`.

    scale: "shared" (one byte axis for all rows) or "row" (each row fills the width; x is the fraction of the
    row). wrap: "auto" continues rows far longer than the rest on further lines (see auto_wrap), a number of
    bytes wraps at that length, None never wraps. xmax_bytes and min_rows fix the axis length and the row
    height, so that two maps side by side share one scale. max_rows counts lines, summary included.
    compact: short row labels and no stats line (the stepper's quick frames, which show them as HTML).
    request: a requested size in bytes (the one a story is about, as chapter 3's 2 GiB gradient): every live
    block allocated for exactly that many bytes is outlined in vermillion and labelled; when there is none, the
    stats line says the request is not allocated (it failed, or was never made).
    """
    if scale not in ("shared", "row"):
        raise VizInputError(f"scale must be 'shared' or 'row', got {scale!r}")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 2:
        raise VizInputError(f"max_rows must be an int >= 2, got {max_rows!r}")
    bytes_ok = isinstance(wrap, int) and not isinstance(wrap, bool) and wrap > 0
    if not (wrap is None or wrap == "auto" or bytes_ok):
        raise VizInputError(f"wrap must be 'auto', None or a positive number of bytes, got {wrap!r}")
    src = resolve(source, device_free=device_free)
    all_rows = segment_rows(src.snapshot, src.reservations)
    info = MapInfo(rows=[])
    for row in all_rows:
        info.reserved += row.reserved
        info.allocated += row.bytes_of("live")
    free = src.device_free
    stats = say(TEXT, "stats", allocated=format_size(info.allocated), reserved=format_size(info.reserved))
    if free is not None:
        stats += say(TEXT, "stats_free", free=format_size(free))
    targets: set[int] = set()
    if request is not None:
        targets = {b["address"] for seg in src.snapshot.get("segments", []) for b in seg.get("blocks", [])
                   if b.get("state") == "active_allocated" and b.get("requested_size") == request}
        info.request_found = bool(targets)
        if not targets:
            stats += "\n" + say(TEXT, "request_missing", size=format_size(request))
    ax.set_title(title if compact else titled(stats, title), fontsize=10, pad=12)
    if not all_rows:
        ax.text(0.5, 0.5, say(TEXT, "nothing"), ha="center", va="center", fontsize=13, transform=ax.transAxes,
                gid="nothing")
        ax.set_axis_off()
        return info

    rows, rest = select_rows(all_rows, max_rows)
    if scale == "row":
        wrap = None
    elif wrap == "auto":
        wrap = auto_wrap([r.extent for r in rows], max_rows)
    elif isinstance(wrap, int):  # never more lines for one row than the map has
        wrap = max(wrap, -(-max(r.extent for r in rows) // (max_rows - 1)))
    assert wrap is None or isinstance(wrap, int)
    rows, rest = fit_rows(rows, rest, wrap, max_rows)
    lines = wrap_lines(rows, wrap)
    info.rows = rows
    info.grouped = sum(r.ranges for r in rest)
    info.grouped_bytes = {k: sum(r.bytes_of(k) for r in rest) for k in KINDS}
    found = largest_free(rows)
    info.largest = found

    longest = wrap or max(max(r.extent for r in rows), xmax_bytes or 0)
    if scale == "row":
        unit, unit_name, xmax = 1, ROW_FRACTION, 1.0
    else:
        unit, unit_name = choose_unit(longest)
        xmax = longest / unit
    info.unit, info.unit_name, info.xmax = unit, unit_name, xmax

    def x_of(line: Line, offset: int) -> float:
        """x of a row offset on its line: bytes from the line's start, in units (or a fraction of the row)."""
        return offset / max(rows[line.row].extent, 1) if scale == "row" else (offset - line.start) / unit

    budget = RECT_BUDGET
    dense: dict[str, list[list[tuple[float, float]]]] = {k: [] for k in KINDS}
    ticks: list[list[tuple[float, float]]] = []
    marks: list[tuple[int, float, float]] = []
    min_gap = xmax / 700  # closer block boundaries would smear into a white band
    min_w = xmax * MIN_BLOCK_FRACTION
    h = ROW_HEIGHT
    labels = []
    streams, devices = {r.stream for r in all_rows}, {r.device for r in all_rows}
    runs_of = {i: merge_runs(row.pieces) for i, row in enumerate(rows)}
    request_spans: list[tuple[int, float, float]] = []  # (line, x, width) of the marked request's block
    for y, line in enumerate(lines):
        row = rows[line.row]
        first = line.start == 0
        labels.append(_row_label(row, streams, devices, compact) if first else f"⋯ +{short_size(line.start)}")
        y0 = y - h / 2
        frame = Rectangle((0, y0), x_of(line, line.start + line.length), h, fill=False, edgecolor="#444444",
                          linewidth=0.6, zorder=3, gid=f"segment-{line.row}" if first else None)
        ax.add_artist(frame)
        end = line.start + line.length
        here = []  # the runs on this line, cut at its ends
        for o, n, k, cuts in runs_of[line.row]:
            if o < end and o + n > line.start:
                lo = max(o, line.start)
                here.append((lo, min(o + n, end) - lo, k, [c for c in cuts if line.start < c < end]))
        as_rects = len(here) <= budget
        if as_rects:
            budget -= len(here)
        last_tick = -1.0
        tiny: list[tuple[float, str]] = []
        for off, size, kind, cuts in here:
            info.kinds.add(kind)
            x, w = x_of(line, off), x_of(line, off + size) - x_of(line, off)
            if as_rects and kind in ("live", "pending") and 0 < w < min_w:
                # drawn again below, widened, over its free neighbour (a dense row of thousands of blocks is
                # left as it is: there the tiny blocks show as a texture, and widening each would mislead)
                tiny.append((x, kind))
            if as_rects:
                ax.add_artist(_block_rect(x, y0, w, h, kind))
            else:
                dense[kind].append([(x, y0), (x + w, y0), (x + w, y0 + h), (x, y0 + h)])
            for c in cuts:
                xc = x_of(line, c)
                if xc - last_tick >= min_gap:
                    ticks.append([(xc, y0), (xc, y0 + h)])
                    last_tick = xc
        line_end = x_of(line, line.start + line.length)
        for x, kind in tiny:
            x = max(0.0, min(x, line_end - min_w))  # a block at the row's end grows to the left, inside the row
            rect = _block_rect(x, y0, min_w, h, kind)
            rect.set_zorder(2.5)  # over the free neighbour, under the outline of the largest free block
            rect.set_gid(f"tiny-{kind}")
            ax.add_artist(rect)
            info.widened += 1
        for p in row.pieces if targets else ():
            lo, hi = max(p.offset, line.start), min(p.offset + p.size, end)
            if p.address in targets and lo < hi:
                request_spans.append((y, x_of(line, lo), x_of(line, hi) - x_of(line, lo)))
        if found is not None and found[0] == line.row:
            p = found[1]
            lo, hi = max(p.offset, line.start), min(p.offset + p.size, end)
            if lo < hi or (p.size == 0 and lo == p.offset):
                marks.append((y, x_of(line, lo), x_of(line, hi) - x_of(line, lo)))
    for kind, verts in dense.items():
        if verts:  # no edges: a dense row's thousands of outlines would be all there is to see
            style = kind_style(kind)
            ax.add_collection(PolyCollection(verts, facecolors=style["facecolor"], edgecolors="none",
                                             hatch=style["hatch"], gid=f"dense-{kind}"))
    if ticks:
        ax.add_collection(LineCollection(ticks, colors="white", linewidths=0.7, zorder=2, gid="block-ticks"))

    n = len(lines)
    xlabel = say(TEXT, "xlabel") + ("" if scale == "row" else f" ({unit_name})")
    if any(line.start > 0 for line in lines):
        # on a line of its own: beside a second panel, one long line would be cut off at the figure's edge
        xlabel += "\n" + say(TEXT, "wrapped", size=short_size(wrap or 0))
    if info.widened:
        xlabel += "\n" + say(TEXT, "widened_many" if info.widened > 1 else "widened_one", n=info.widened)
    if rest:
        xlabel += "\n" + _draw_summary(ax, n, rest, info)
        labels.append(say(TEXT, "grouped_row", n=info.grouped))
        n += 1
    if request_spans:
        widest = max(request_spans, key=lambda span: span[2])  # a wrapped block is named once, where it is widest
        for span in request_spans:
            _mark_request(ax, *span, size=request or 0, label=span == widest)
    if found is not None:
        for j, (y, x, w) in enumerate(marks):
            _mark_largest(ax, y, x, w, found[1].size, xmax, label=j == 0)
        if marks:
            info.mark = (marks[0][0], marks[0][1], marks[0][2], found[1].size, xmax)
    ax.set_yticks(range(n), labels, fontsize=7.5)
    ax.tick_params(axis="y", length=0)
    ax.set_ylim(max(n, min_rows) - 0.4, -1.0)  # row 0 on top, with room above it for the largest-block label
    ax.set_xlim(0, xmax * 1.01)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    hide_spines(ax, "top", "right", "left")
    return info


def _block_rect(x: float, y: float, w: float, h: float, kind: str) -> Rectangle:
    return Rectangle((x, y), w, h, linewidth=0, **kind_style(kind))


def _draw_summary(ax: Axes, y: int, rest: list[Row], info: MapInfo) -> str:
    """The summed-up rows as one stacked bar, to scale when it fits the axis, else scaled down. Returns the
    sentence that says what was grouped, for under the map."""
    total = sum(info.grouped_bytes.values())
    to_axis = (1 / info.unit) if info.unit_name != ROW_FRACTION else 1 / total
    factor = 1.0 if total * to_axis <= info.xmax else info.xmax / (total * to_axis)
    h = ROW_HEIGHT
    x = 0.0
    for kind in KINDS:
        size = info.grouped_bytes[kind]
        if size:
            w = size * to_axis * factor
            rect = _block_rect(x, y - h / 2, w, h, kind)
            rect.set_gid(f"summary-{kind}")
            ax.add_artist(rect)
            info.kinds.add(kind)
            x += w
    ax.add_artist(Rectangle((0, y - h / 2), x, h, fill=False, edgecolor="#444444", linewidth=0.6,
                           linestyle="--", zorder=3, gid="summary-row"))
    biggest = max(r.reserved for r in rest)
    note = say(TEXT, "summary", n=info.grouped, biggest=short_size(biggest), total=format_size(total))
    if factor < 1.0:
        note += say(TEXT, "summary_scaled", factor=f"{1 / factor:.3g}")
    return note


def _mark_request(ax: Axes, y: int, x: float, w: float, *, size: int, label: bool) -> None:
    """Outline the block of the request the figure is about, and name it inside the block."""
    h = ROW_HEIGHT + 0.16
    ax.add_artist(Rectangle((x, y - h / 2), w, h, fill=False, edgecolor=OOM_COLOR, linewidth=2.4, zorder=5,
                           gid="request-block"))
    if label:
        ax.text(x + w / 2, y, say(TEXT, "request_label", size=format_size(size)), ha="center", va="center", fontsize=8,
                color="white", fontweight="bold", zorder=6, clip_on=True, gid="request-label")


def _mark_largest(ax: Axes, y: int, x: float, w: float, size: int, xmax: float, label: bool = True) -> None:
    h = ROW_HEIGHT + 0.16
    ax.add_artist(Rectangle((x, y - h / 2), w, h, fill=False, edgecolor=MARK_COLOR, linewidth=1.8, zorder=5,
                           gid="largest-free-block" if label else None))
    if label:
        _label_largest(ax, (y, x, w, size, xmax))


def _label_largest(ax: Axes, mark: tuple[int, float, float, int, float]) -> None:
    """Write the size inside the outlined block when it fits there (with its name, or alone: the legend names
    the outline), else above it with an arrow, where it may cover part of the row above, so only as a last
    resort. Called again once the layout is final."""
    for old in [t for t in ax.texts if t.get_gid() == "largest-free-label"]:
        old.remove()
    y, x, w, size, xmax = mark
    text = say(TEXT, "largest_size", largest=say(TEXT, "largest"), size=format_size(size))
    fig = ax.get_figure()
    axis_in = ax.get_position().width * fig.get_size_inches()[0] if fig is not None else 6.0
    block_in = w / max(xmax * 1.01, 1e-12) * axis_in
    for inside in (text, format_size(size)):
        if block_in > len(inside) * 8 * 0.55 / 72 + 0.15:  # about 0.55 em a character at 8 pt
            ax.text(x + w / 2, y, inside, ha="center", va="center", fontsize=8, zorder=6,
                    gid="largest-free-label")
            return
    right = x + w / 2 > 0.6 * xmax
    h = ROW_HEIGHT + 0.16
    ax.annotate(text, xy=(x + w / 2, y - h / 2), xytext=(-8 if right else 8, 9), textcoords="offset points",
                ha="right" if right else "left", va="bottom", fontsize=8, zorder=6, annotation_clip=False,
                arrowprops={"arrowstyle": "-|>", "color": MARK_COLOR, "linewidth": 1, "shrinkA": 0,
                            "shrinkB": 0},
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85},
                gid="largest-free-label")


def legend_handles(kinds: set[str], largest: bool, request: bool = False) -> list[Any]:
    handles = kind_legend(kinds)
    if largest:
        handles.append(Line2D([], [], color=MARK_COLOR, linewidth=1.8,
                              label=say(TEXT, "largest_outlined", largest=say(TEXT, "largest"))))
    if request:
        handles.append(Line2D([], [], color=OOM_COLOR, linewidth=2.4, label=say(TEXT, "request_outlined")))
    return handles


def map_layout(fig: Figure, panels: int) -> list[Axes]:
    """Axes for `panels` maps side by side; fit_map_figure sizes them once they are drawn."""
    return fig.subplots(1, panels, squeeze=False)[0].tolist()


def fit_map_figure(fig: Figure, axes: list[Axes], infos: list[MapInfo], *, fixed_height: float | None = None,
                   legend_rows: int = 2, left_in: float = 2.9) -> None:
    """Size the figure to its rows (0.3 in each) and set margins in inches, so labels fit at any height."""
    width = fig.get_size_inches()[0]
    title_lines = max(len(ax.get_title().splitlines()) for ax in axes)
    label_lines = max(len(ax.get_xlabel().splitlines()) for ax in axes)
    top = 0.3 + 0.17 * title_lines + (0.3 if fig.get_suptitle() else 0)
    bottom = 0.3 + 0.17 * label_lines + 0.22 * legend_rows
    lines = max(max(ax.get_ylim()) + 0.4 for ax in axes) if infos else 1
    height = fixed_height or top + bottom + 0.3 * (lines + 1.4)  # 1.4: room for the largest-block label
    fig.set_size_inches(width, height)
    right_in, gap_in = 0.25, left_in + 0.2  # y labels need ~2.9 in (compact ones less), beside each panel
    panels = len(axes)
    axis_width = (width - left_in - right_in - gap_in * (panels - 1)) / panels
    fig.subplots_adjust(left=left_in / width, right=1 - right_in / width, top=1 - top / height,
                        bottom=bottom / height, wspace=gap_in / axis_width)
    for ax, info in zip(axes, infos, strict=False):
        if info.mark is not None:
            _label_largest(ax, info.mark)  # now that the axis has its final width
    kinds = set().union(*(i.kinds for i in infos))
    if legend_rows:
        handles = legend_handles(kinds, any(i.largest is not None for i in infos),
                                 any(i.request_found for i in infos))
        fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)


def map_figure(panels: int, title: str | None = None, *, height: float = 6.0, publish: bool = True) -> Figure:
    """A figure for `panels` maps side by side (map_layout makes their axes; fit_map_figure sets the height a
    plot needs, unless fixed), with `title` over all of them."""
    fig = new_figure(11.0 if panels == 1 else 16.0, height, publish=publish)
    if title:
        fig.suptitle(title, fontsize=12, fontweight="bold")
    return fig


def plot_segment_map(
    source: Any,
    *,
    device_free: int | None = None,
    max_rows: int = 40,
    scale: str = "shared",
    wrap: int | str | None = "auto",
    title: str | None = None,
) -> Figure:
    """A segment map of a snapshot dict, an allocator, or a snapshot pickle's path, as a matplotlib Figure.
    Options as draw_segment_map's."""
    src = resolve(source, device_free=device_free)
    if not src.snapshot.get("segments"):
        detail = say(TEXT, "nothing_detail")
        if src.device_free is not None:
            detail += say(TEXT, "nothing_free", free=format_size(src.device_free))
        return nothing_figure(say(TEXT, "nothing"), detail)
    fig = map_figure(1, title)
    (ax,) = map_layout(fig, 1)
    info = draw_segment_map(ax, src, max_rows=max_rows, scale=scale, wrap=wrap)
    fit_map_figure(fig, [ax], [info])
    return fig


def plot_side_by_side(
    first: Any,
    second: Any,
    titles: tuple[str, str] | None = None,
    *,
    max_rows: int = 30,
    device_free: tuple[int | None, int | None] = (None, None),
    title: str | None = None,
    request: int | None = None,
) -> Figure:
    """Two segment maps next to each other on one byte scale and one row height: the same moment under two
    configurations. Each takes a snapshot dict, an allocator or a snapshot pickle's path. titles: the two panels'
    names (default: native and expandable segments, in the notebook's language). request: a requested size to
    mark on both sides (see draw_segment_map)."""
    if titles is None:
        titles = (say(TEXT, "native"), say(TEXT, "expandable"))
    sources = [resolve(s, device_free=f) for s, f in zip((first, second), device_free, strict=True)]
    fig = map_figure(2, title)
    axes = map_layout(fig, 2)
    shown = [select_rows(segment_rows(s.snapshot, s.reservations), max_rows)[0] for s in sources]
    extents = [[r.extent for r in rows] for rows in shown]
    wrap = auto_wrap(extents[0] + extents[1], max_rows)
    longest = max((e for side in extents for e in side), default=0)
    infos = [draw_segment_map(ax, src, max_rows=max_rows, wrap=wrap, xmax_bytes=longest, title=name,
                              request=request)
             for ax, src, name in zip(axes, sources, titles, strict=True)]
    rows = max(int(max(ax.get_ylim()) + 0.4) for ax in axes)
    for ax in axes:  # one row height on both sides
        if ax.axison:
            ax.set_ylim(rows - 0.4, -1.0)
    fit_map_figure(fig, axes, infos)
    return fig
