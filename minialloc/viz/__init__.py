"""Seeing memory: pictures of the caching allocator's state and history (needs matplotlib; ipywidgets for the
stepper). Nothing here is imported by `import minialloc`.

    >>> from minialloc import CachingAllocator, SimulatedGPU
    >>> from minialloc import viz
    >>> a = CachingAllocator(SimulatedGPU("8GiB"), "")
    >>> p = a.malloc(3 << 20)
    >>> fig = viz.plot_segment_map(a)          # one bar per segment, blocks coloured by state
    >>> fig = viz.plot_timeline(a)             # allocated / reserved across the recorded trace
    >>> paths = viz.save_plots(a, "plots")     # doctest: +SKIP
    >>> # a slider in JupyterLab:
    >>> viz.Stepper([(4 << 20, 0, "x"), (-1, 0, "x")])   # doctest: +SKIP

Every function takes a snapshot dict (torch.cuda.memory._snapshot()'s schema), a CachingAllocator, or the path
of a snapshot pickle. Empty input gives a picture that says so; malformed input raises VizInputError (or
SnapshotError from a file) naming the place of the problem.
"""

from ._common import COLORS, LABELS, VizInputError, figure_texts
from .block_table import block_table_rows, plot_block_table
from .export import save_demo_plots, save_plots, write_trace_plot_html
from .replay import Replay, normalize_events, random_events
from .segment_map import draw_segment_map, plot_segment_map, plot_side_by_side, segment_rows
from .stepper import Stepper, compare_configs
from .timeline import Timeline, plot_timeline, timeline_data

__all__ = [
    "COLORS",
    "LABELS",
    "Replay",
    "Stepper",
    "Timeline",
    "VizInputError",
    "block_table_rows",
    "compare_configs",
    "draw_segment_map",
    "figure_texts",
    "normalize_events",
    "plot_block_table",
    "plot_segment_map",
    "plot_side_by_side",
    "plot_timeline",
    "random_events",
    "save_demo_plots",
    "save_plots",
    "segment_rows",
    "timeline_data",
    "write_trace_plot_html",
]
