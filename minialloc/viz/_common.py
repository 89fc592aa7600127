"""What the plots share: the palette and how each kind of block is filled, turning any input into a snapshot,
units, titles and axes, the figure itself (made, shown, encoded, discarded), the "nothing here" picture.

matplotlib is imported here, not by `import minialloc`: the allocator must stay usable (and quick to import)
on machines without it.

Figures and notebooks. In a script, a figure is a plain Figure that pyplot never sees: drawing hundreds of
frames keeps no global figure list alive and never opens a window. In Jupyter (the inline backend) a plot is
a pyplot figure, so that it shows at the end of the cell as any matplotlib plot does, even when the line ends
with ";" (as the course's notebooks write it); and a returned plot shows once, not twice (VizFigure).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure

from ..lang import messages, say
from ..sizes import TEXT as SIZE_TEXT
from ..sizes import GiB, KiB, MiB, format_size

# Okabe & Ito's palette, chosen to stay distinguishable under the common colour-vision deficiencies.
# Free pieces of split segments get the loud orange: they are the fragmentation this course is about.
COLORS: dict[str, str] = {
    "live": "#0072B2",  # blue
    "pending": "#CC79A7",  # reddish purple
    "free_split": "#E69F00",  # orange
    "free_whole": "#009E73",  # bluish green
    "unmapped": "#E8E8E8",  # light grey, hatched, so it reads as "no memory here" even in greyscale
}
UNMAPPED_HATCH = "////"
UNMAPPED_EDGE = "#9A9A9A"
MARK_COLOR = "#000000"  # outline of the largest cached free block
OOM_COLOR = "#D55E00"  # vermillion
RELEASE_COLOR = "#009E73"
ALLOCATED_COLOR = COLORS["live"]
RESERVED_COLOR = "#E69F00"
# The legend's name of each kind of block, in English, shown in the notebook's language (minialloc.lang).
KIND_TEXT = messages("minialloc.viz._common.KIND_TEXT", {
    "live": "live block (allocated)",
    "pending": "pending free (used on another stream)",
    "free_split": "free piece of a split segment",
    "free_whole": "free whole segment (empty_cache returns it)",
    "unmapped": "unmapped pages (expandable segment)",
})
KINDS = tuple(COLORS)


class _Labels(Mapping[str, str]):
    """LABELS: kind -> its legend text, in the language current when it is read."""

    def __getitem__(self, kind: str) -> str:
        return say(KIND_TEXT, kind)

    def __iter__(self) -> Iterator[str]:
        return iter(KIND_TEXT)

    def __len__(self) -> int:
        return len(KIND_TEXT)

    def __repr__(self) -> str:
        return repr(dict(self))


LABELS: Mapping[str, str] = _Labels()


def kind_style(kind: str) -> dict[str, Any]:
    """How a block of `kind` is filled wherever it is drawn (a block, a dense row, a legend entry): its colour,
    and for unmapped pages the hatching and its edge colour, so they read as "no memory here" in greyscale too."""
    if kind == "unmapped":
        return {"facecolor": COLORS[kind], "edgecolor": UNMAPPED_EDGE, "hatch": UNMAPPED_HATCH}
    return {"facecolor": COLORS[kind], "edgecolor": "none", "hatch": None}


def kind_legend(kinds: set[str]) -> list[Any]:
    """A legend entry for each kind of block in `kinds`, in the palette's order, named in the current language."""
    from matplotlib.patches import Patch

    return [Patch(label=LABELS[kind], **kind_style(kind)) for kind in KINDS if kind in kinds]


class VizInputError(ValueError):
    """Input the plots cannot read: the message says what is wrong and where."""


@dataclass
class Source:
    """A snapshot plus what only a live allocator knows (device free memory, capacity, reservations)."""

    snapshot: dict[str, Any]
    allocator: Any | None = None
    device_free: int | None = None
    capacity: int | None = None
    reservations: list[tuple[int, int]] | None = None  # (start, size) of expandable segments' address ranges


def resolve(source: Any, *, device_free: int | None = None, validate: bool = True) -> Source:
    """Accept a snapshot dict, an allocator (anything with .snapshot()), or the path of a snapshot pickle."""
    if isinstance(source, Source):
        return source
    if isinstance(source, (str, os.PathLike)):
        from ..snapshot import load_snapshot  # validates as it loads

        return Source(load_snapshot(source), device_free=device_free)
    if isinstance(source, dict):
        if validate:
            check_snapshot(source)
        return Source(source, device_free=device_free)
    if callable(getattr(source, "snapshot", None)):
        snap = source.snapshot()
        free = capacity = None
        device = getattr(source, "device", None)
        if callable(getattr(device, "mem_get_info", None)):
            free, capacity = device.mem_get_info()
        reservations = [(seg.ptr, seg.size) for seg in getattr(source, "expandable_segments", [])]
        return Source(snap, source, free if device_free is None else device_free, capacity, reservations)
    raise VizInputError(
        f"expected a snapshot dict, a CachingAllocator or the path of a snapshot pickle, got "
        f"{type(source).__name__}"
    )


def check_snapshot(snap: dict[str, Any]) -> None:
    """Refuse a malformed snapshot with the place of the first problem (minialloc.snapshot's checks).

    The trace is left to the timeline, which checks the fields it reads entry by entry: validating a
    150,000-entry trace in full takes a second, which a segment map should not pay for."""
    from ..snapshot import SnapshotError, validate_snapshot

    try:
        validate_snapshot({k: v for k, v in snap.items() if k != "device_traces"}, "snapshot")
    except SnapshotError as e:
        raise VizInputError(str(e)) from None


def choose_unit(largest: float) -> tuple[int, str]:
    """A unit that keeps axis numbers short: the biggest of B, KiB, MiB, GiB with at least 4 of it."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if largest >= 4 * unit:
            return unit, name
    return 1, say(SIZE_TEXT, "unit_bytes")


def short_size(n: float) -> str:
    """format_size without trailing zeros, for tight labels: '20 MiB', '1.5 GiB'."""
    text = format_size(int(n))
    number, _, unit = text.partition(" ")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return f"{number} {unit}"


def titled(head: str, title: str | None) -> str:
    """A plot's heading line (its numbers) under the caller's title, when there is one."""
    return head if title is None else f"{title}\n{head}"


def hide_spines(ax: Any, *sides: str) -> None:
    """No frame on these sides of the axes: the bars and curves carry the picture."""
    for side in sides:
        ax.spines[side].set_visible(False)


class VizFigure(Figure):
    """A Figure that IPython shows once. Whoever displays it first (the cell's result, or the inline
    backend's end-of-cell display of pyplot's figures) shows a PNG and takes it from pyplot, so the other
    does not show a copy; a later display (the figure shown again in another cell) shows it again."""

    def _ipython_display_(self) -> None:
        from IPython.display import Image, display

        display(Image(png_bytes(self, dpi=100)))
        discard(self)


def _notebook_backend() -> bool:
    """Jupyter's inline backend (ipympl's interactive figures are left to ipympl: plain figures there)."""
    import matplotlib

    return "inline" in matplotlib.get_backend().lower()


def managed_by_pyplot(fig: Figure) -> bool:
    from matplotlib._pylab_helpers import Gcf

    return any(m.canvas.figure is fig for m in Gcf.get_all_fig_managers())


def new_figure(width: float, height: float, *, publish: bool = True) -> Figure:
    """A figure to draw on. publish: in a notebook, hand it to pyplot so the cell shows it (see the module
    docstring); False for pictures only saved or encoded (the stepper's frames, save_plots' files)."""
    import matplotlib.pyplot as plt  # also lets the notebook backend register its Figure formatter

    if publish and _notebook_backend():
        return plt.figure(figsize=(width, height), FigureClass=VizFigure)
    return VizFigure(figsize=(width, height))


def png_bytes(fig: Figure, dpi: float) -> bytes:
    """The figure encoded as PNG, in memory (a notebook's display, a page's embedded picture, a stepper frame)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def discard(fig: Figure) -> None:
    """Forget a figure that was only saved: in a notebook pyplot would otherwise show it too."""
    if managed_by_pyplot(fig):
        import matplotlib.pyplot as plt

        plt.close(fig)


def nothing_figure(message: str, detail: str = "") -> Figure:
    """A readable picture in place of a plot of nothing: says what is missing and why, no traceback."""
    fig = new_figure(8, 2.2)
    fig.text(0.5, 0.62, message, ha="center", va="center", fontsize=14, gid="nothing")
    if detail:
        fig.text(0.5, 0.32, detail, ha="center", va="center", fontsize=9, color="#555555", wrap=True)
    return fig


def figure_texts(fig: Figure) -> list[str]:
    """Every text in a figure (titles, labels, annotations): what a test or a reader sees written on it."""
    from matplotlib.text import Text

    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]
