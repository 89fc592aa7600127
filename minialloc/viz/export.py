"""Pictures on disk: PNG and SVG files, `minialloc plot FILE -o DIR`, and PyTorch's own HTML trace viewer."""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from ..lang import messages, say
from ._common import VizInputError, discard, png_bytes, resolve
from .segment_map import plot_segment_map, plot_side_by_side
from .timeline import plot_timeline

FORMATS = ("png", "svg")

# Every word of the pictures' files and page, in English, shown in the notebook's language (minialloc.lang).
TEXT = messages("minialloc.viz.export.TEXT", {
    "demo_title": "one workload under two configurations",
    "alt_map": "segment map",
    "alt_timeline": "timeline",
    "static": "Static pictures (minialloc): segment map and timeline",
})


def save_plots(
    source: Any,
    out_dir: str | os.PathLike[str],
    *,
    device_free: int | None = None,
    max_rows: int = 40,
    formats: Sequence[str] = FORMATS,
    dpi: int = 110,
    prefix: str = "",
) -> list[Path]:
    """Write segment_map.{png,svg} and timeline.{png,svg} for a snapshot dict, an allocator or a snapshot
    pickle's path into out_dir (created if needed), each name preceded by `prefix`. Returns the paths
    written, in that order."""
    for fmt in formats:
        if fmt not in FORMATS:
            raise VizInputError(f"unknown format {fmt!r}: use {' or '.join(FORMATS)}")
    src = resolve(source, device_free=device_free)  # once: an allocator's .snapshot() is taken a single time
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    figures = (("segment_map", plot_segment_map(src, max_rows=max_rows)), ("timeline", plot_timeline(src)))
    for name, fig in figures:
        written += _write(fig, out / f"{prefix}{name}", formats, dpi)
    return written


def save_demo_plots(
    native: Any,
    expandable: Any,
    out_dir: str | os.PathLike[str],
    *,
    titles: tuple[str, str] | None = None,
    formats: Sequence[str] = FORMATS,
) -> list[Path]:
    """The demo's pictures: both configurations' segment maps side by side (side_by_side.png/.svg), then
    each one's segment map and timeline (native_*.png, expandable_*.png, ...). Takes two allocators (or
    snapshots) that ran the same workload. Returns the paths written. titles: the two panels' names (default:
    native and expandable segments, in the notebook's language, as plot_side_by_side names them)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sources = [resolve(native), resolve(expandable)]  # one .snapshot() each, shared by every picture
    fig = plot_side_by_side(sources[0], sources[1], titles, title=say(TEXT, "demo_title"))
    written = _write(fig, out / "side_by_side", formats, dpi=110)
    for src, prefix in zip(sources, ("native_", "expandable_"), strict=True):
        written += save_plots(src, out, formats=formats, prefix=prefix)
    return written


def _write(fig: Figure, stem: Path, formats: Sequence[str], dpi: int) -> list[Path]:
    """Write `fig` as stem.png, stem.svg, ... (one file a format) and discard it: written to files, not shown (in
    a notebook the cell would show it as well). Returns the paths written."""
    paths = [stem.with_name(f"{stem.name}.{fmt}") for fmt in formats]
    for path, fmt in zip(paths, formats, strict=True):
        fig.savefig(path, format=fmt, dpi=dpi)
    discard(fig)
    return paths


def figure_png(fig: Figure, dpi: int = 90) -> bytes:
    """The figure as PNG bytes; the figure is then discarded (see discard)."""
    png = png_bytes(fig, dpi)
    discard(fig)
    return png


def write_trace_plot_html(
    source: Any, path: str | os.PathLike[str], *, plot_segments: bool = False, static_pictures: bool = True
) -> Path:
    """Write PyTorch's memory viewer (torch.cuda._memory_viz.trace_plot) for minialloc's snapshot to path.

    The page embeds the pickled snapshot and loads PyTorch's MemoryViz.js from a CDN, so it needs a network
    connection to draw. With static_pictures, a collapsed section under the viewer holds minialloc's segment
    map and timeline as PNGs, readable offline. Needs torch; its CPU build is enough.
    """
    try:
        from torch.cuda._memory_viz import trace_plot
    except ImportError as e:
        raise RuntimeError(
            "write_trace_plot_html needs PyTorch's viewer; its CPU build is enough: "
            "python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
        ) from e
    src = resolve(source)
    page = trace_plot(src.snapshot, plot_segments=plot_segments)
    if static_pictures:
        pictures = "".join(
            f'<img alt="{html.escape(alt)}" style="max-width:100%" src="data:image/png;base64,'
            f'{base64.b64encode(figure_png(fig)).decode("ascii")}">'
            for alt, fig in ((say(TEXT, "alt_map"), plot_segment_map(src)),
                             (say(TEXT, "alt_timeline"), plot_timeline(src)))
        )
        block = (f"<details id=\"minialloc-static\"><summary>{html.escape(say(TEXT, 'static'))}</summary>"
                 f"{pictures}</details>\n")
        page = page.replace("</body>", block + "</body>", 1) if "</body>" in page else page + block
    out = Path(path)
    out.write_text(page, encoding="utf-8")
    return out
