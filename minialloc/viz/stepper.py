"""Step through a list of events with a slider: the segment map and the stats after each one.

The events and how they replay: see replay.py. A step redraws the map from the replay's allocator; the
widget's frames leave out the slow-to-draw text (legend, long labels) and show it once, as HTML.

In JupyterLab, displaying a Stepper shows a play button, a slider and the picture. The same output carries
a static PNG of the current step and of a few key frames (peak reserved, first OOM, last step) as HTML:
nbconvert falls back to it when no widget state was saved, and a viewer without widgets (GitHub, an exported
HTML page) shows it.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ..lang import messages, say
from ..sizes import format_size
from ._common import COLORS, LABELS, UNMAPPED_EDGE, png_bytes
from .replay import Replay
from .segment_map import TEXT as MAP_TEXT  # the outline's name, as the segment map's legend says it
from .segment_map import draw_segment_map, fit_map_figure, map_figure, map_layout, plot_side_by_side

# Every word the stepper shows, in English, shown in the notebook's language (minialloc.lang), chosen when it is drawn.
TEXT = messages("minialloc.viz.stepper.TEXT", {
    "stats":
        "step {step} of {steps}: {outcome}\nallocated {allocated} · reserved {reserved} · reserved but unused "
        "{unused} · largest cached free block {largest}",
    "quick_title": "step {step}",
    "title": "step {step}/{steps}: {outcome}",
    "default_config": "default (native)",
    "same_events_end": "the same {n} events, at the end",
    "same_events_step": "the same {n} events, at step {step}",
    "alt": "segment map at step {step}",
    "play": "play",
    "step": "step",
    "back": "one step back",
    "forward": "one step forward",
    "rerun":
        "The controls need this notebook's kernel, and a reopened notebook has none yet: run the notebook's first "
        "code cell (its imports), then run this cell again.",
})


def _swatch(kind: str) -> str:
    fill = COLORS[kind]
    if kind == "unmapped":
        fill = f"repeating-linear-gradient(45deg, {fill} 0 3px, {UNMAPPED_EDGE} 3px 4px)"
    return (f'<span style="display:inline-block;width:1.4em;height:0.8em;background:{fill};'
            f'vertical-align:middle"></span> {html.escape(LABELS[kind])}')


def _legend_html(kinds: Iterable[str] = tuple(COLORS)) -> str:
    """The quick frames leave the legend out (text is slow to draw): the widget shows it once, as HTML, naming
    only the kinds of block this replay can show."""
    return ("<div style='font-size:85%;margin:2px 0'>" + " &nbsp; ".join(_swatch(k) for k in COLORS if k in kinds)
            + " &nbsp; <span style='display:inline-block;width:1.2em;height:0.7em;border:2px solid black;"
            f"vertical-align:middle'></span> {html.escape(say(MAP_TEXT, 'largest'))}</div>")


def compare_configs(
    events: Sequence[Any],
    configs: tuple[str, str] = ("", "expandable_segments:True"),
    *,
    step: int | None = None,
    capacity: int | str = "80GiB",
    titles: tuple[str, str] | None = None,
    max_rows: int = 30,
) -> Figure:
    """Replay the same events under two configurations and draw both segment maps at the same step."""
    allocators = []
    events = list(events)
    for config in configs:
        replay = Replay(events, config, capacity=capacity)
        allocators.append(replay.goto(len(replay) if step is None else step))
    names = titles or tuple(c or say(TEXT, "default_config") for c in configs)
    if step is None:
        title = say(TEXT, "same_events_end", n=len(replay))
    else:
        title = say(TEXT, "same_events_step", n=len(replay), step=step)
    return plot_side_by_side(allocators[0], allocators[1], (names[0], names[1]), max_rows=max_rows, title=title)


class Stepper:
    """A slider over a replay. Display it in JupyterLab; or call frame_png(n) / figure(n) anywhere."""

    def __init__(self, events: Iterable[Any], config: Any = None, *, capacity: int | str = "80GiB",
                 checkpoint_every: int = 1000, max_rows: int = 20, precompute: bool = True,
                 title: str | None = None, dpi: int = 72, key_frames: bool = True) -> None:
        # a Replay already built (Stepper.from_snapshot) is used as it is
        self.replay = events if isinstance(events, Replay) else Replay(events, config, capacity=capacity,
                                                                         checkpoint_every=checkpoint_every)
        self.max_rows = max_rows
        self.title = title
        self.dpi = dpi
        self.step = 0
        # False: a page without widgets shows the current step only, not the peak and the first OOM (a chapter
        # holds those back until the learner has predicted what they show)
        self.with_key_frames = key_frames
        self.samples = self.replay.precompute() if precompute else None
        self._height = 2.2 + 0.3 * max_rows  # one size for every step, so the picture never jumps

    @classmethod
    def from_snapshot(cls, source: Any, device: int = 0, *, config: Any = None, **kwargs: Any) -> Stepper:
        """A stepper over a recorded run (a snapshot dict or a pickle's path), from the state at its first trace
        entry, under the run's own settings: the same reader and replay as `minialloc replay`."""
        every = kwargs.pop("checkpoint_every", 1000)
        return cls(Replay.from_snapshot(source, device, config=config, checkpoint_every=every), **kwargs)

    def __len__(self) -> int:
        return len(self.replay)

    def stats_text(self) -> str:
        a = self.replay.allocator
        allocated, reserved = a.memory_allocated(), a.memory_reserved()
        return say(TEXT, "stats", step=self.replay.position, steps=len(self.replay), outcome=self.replay.outcome,
                   allocated=format_size(allocated), reserved=format_size(reserved),
                   unused=format_size(reserved - allocated), largest=format_size(a.largest_free_block()))

    def figure(self, n: int | None = None, *, quick: bool = False) -> Figure:
        """The segment map after n events (the current step if None). quick: the widget's frame, with short
        row labels and no title or legend (the widget shows those as HTML), since drawing text is most of the
        cost of a frame."""
        return self._figure(n, quick, publish=True)

    def _figure(self, n: int | None, quick: bool, publish: bool) -> Figure:
        if n is not None:
            self.step = n
        allocator = self.replay.goto(self.step)
        # a fresh figure each time: clearing and reusing one slows every draw (matplotlib's transform tree
        # keeps growing), and a new Figure costs about a millisecond
        fig = map_figure(1, height=self._height, publish=publish)
        (ax,) = map_layout(fig, 1)
        rows = min(self.max_rows, 8)
        if quick:
            info = draw_segment_map(ax, allocator, max_rows=self.max_rows, min_rows=rows, compact=True,
                                    title=say(TEXT, "quick_title", step=self.step))
            fit_map_figure(fig, [ax], [info], fixed_height=self._height - 0.8, legend_rows=0, left_in=1.4)
        else:
            text = say(TEXT, "title", step=self.step, steps=len(self.replay), outcome=self.replay.outcome)
            info = draw_segment_map(ax, allocator, max_rows=self.max_rows, min_rows=rows,
                                    title=text if self.title is None else f"{self.title} · {text}")
            fit_map_figure(fig, [ax], [info], fixed_height=self._height)
        return fig

    def frame_png(self, n: int | None = None, *, quick: bool = False, dpi: int | None = None) -> bytes:
        """The picture of step n as PNG bytes (see figure)."""
        fig = self._figure(n, quick, publish=False)  # encoded, not shown: pyplot must not see it
        png = png_bytes(fig, dpi or self.dpi)
        # clearing breaks the figure's reference cycles, so it is freed now rather than by a full garbage
        # collection a few frames later (a pause of 100 ms or more in the middle of playing)
        fig.clear()
        return png

    def key_frames(self, limit: int = 3) -> list[int]:
        """Steps worth a static picture: the peak of reserved memory, the first OOM, the last step."""
        if self.samples is None:
            self.samples = self.replay.precompute()
        peak = int(np.argmax(self.samples[:, 1]))  # the first step at the peak of reserved memory
        picks = [peak] + self.replay.ooms[:1] + [len(self.replay)]
        return sorted(dict.fromkeys(picks))[:limit]

    def static_frames(self, extra_frames: bool = True) -> list[tuple[int, str, str]]:
        """(step, base64 PNG, stats) for the current step, then the key frames: what a page without widgets
        shows. The replay is left at the current step."""
        here = self.step
        frames = []
        for k in [here] + ([k for k in self.key_frames() if k != here] if extra_frames else []):
            png = base64.b64encode(self.frame_png(k)).decode("ascii")
            frames.append((k, png, self.stats_text()))
        self.step = here
        self.replay.goto(here)
        return frames

    def static_html(self, frames: list[tuple[int, str, str]] | None = None) -> str:
        """The static frames as HTML with embedded PNGs and their stats as captions."""
        parts = []
        for k, png, stats in frames if frames is not None else self.static_frames():
            caption = html.escape(stats).replace("\n", "<br>")
            parts.append(f'<figure style="margin:0 0 1em 0"><img src="data:image/png;base64,{png}" '
                         f'alt="{html.escape(say(TEXT, "alt", step=k))}"><figcaption style="font-size:85%">{caption}'
                         "</figcaption></figure>")
        return "<div>" + "".join(parts) + "</div>"

    def widget(self) -> Any:
        """The ipywidgets controls: play, slider, the picture and the stats (needs a live kernel)."""
        import ipywidgets as w

        n = len(self.replay)
        play = w.Play(value=self.step, min=0, max=n, step=1, interval=250, description=say(TEXT, "play"))
        slider = w.IntSlider(value=self.step, min=0, max=n, continuous_update=False, description=say(TEXT, "step"),
                             layout=w.Layout(width="70%"))
        w.jslink((play, "value"), (slider, "value"))
        back = w.Button(description="◀", layout=w.Layout(width="3em"), tooltip=say(TEXT, "back"))
        fwd = w.Button(description="▶", layout=w.Layout(width="3em"), tooltip=say(TEXT, "forward"))
        image = w.Image(value=self.frame_png(self.step, quick=True), format="png")
        stats = w.HTML(self._stats_html())

        def show(change: dict[str, Any]) -> None:
            image.value = self.frame_png(change["new"], quick=True)
            stats.value = self._stats_html()

        slider.observe(show, names="value")
        back.on_click(lambda _: setattr(slider, "value", max(0, slider.value - 1)))
        fwd.on_click(lambda _: setattr(slider, "value", min(n, slider.value + 1)))
        return w.VBox([w.HBox([play, back, fwd, slider]), stats, image])

    def kinds(self) -> set[str]:
        """The kinds of block this replay can show: a pending free needs a record_stream event, unmapped pages
        need expandable segments; live blocks and free pieces and segments are in every replay."""
        kinds = {"live", "free_split", "free_whole"}
        if any(op[0] == "record_stream" for op in self.replay._ops):
            kinds.add("pending")
        if self.replay.allocator.config.expandable_segments:
            kinds.add("unmapped")
        return kinds

    def _stats_html(self) -> str:
        # the last line is for a reopened notebook: its saved widget state shows this view, but no kernel answers.
        # That line says so in words, so ipywidgets' red broken-link icon on every control of a widget without a
        # kernel (the class jupyter-widgets-disconnected, drawn by a ::before rule) only hides the controls: the
        # style turns it off
        return (_legend_html(self.kinds()) + "<pre style='margin:0'>" + html.escape(self.stats_text()) + "</pre>"
                + f"<div style='font-size:85%;color:#555'>{html.escape(say(TEXT, 'rerun'))}</div>"
                + "<style>.jupyter-widgets-disconnected::before{content:none!important;display:none!important}"
                  "</style>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """The widget for a live frontend, plus static pictures for exports and viewers without widgets."""
        bundle: dict[str, Any] = {}
        try:
            widget_bundle = self.widget()._repr_mimebundle_()
            bundle.update(widget_bundle[0] if isinstance(widget_bundle, tuple) else widget_bundle)
        except ImportError:  # no ipywidgets: the static pictures are all there is
            pass
        frames = self.static_frames(extra_frames=self.with_key_frames)
        bundle["text/html"] = self.static_html(frames)
        bundle["image/png"] = frames[0][1]  # the current step, for viewers that take only pictures
        bundle["text/plain"] = f"<Stepper over {len(self.replay)} events>\n{self.stats_text()}"
        return bundle
