"""Scale: a run's memory at another size (context length, batch), predicted from runs of the same program.

The engineer's question before a longer run: "will it fit at twice the context?". A straight line through two
runs' peaks misses it (attention's score tensors grow as the square of the context, the rest about linearly, the
weights not at all, and the allocator rounds and caches on top). So the prediction is made per allocation and then
run through the allocator:

1. Match: the runs' allocations are paired by their stack frames and their order (difflib's longest matching
   blocks over each allocation's frames), against the run at the largest size (the template). Traces of one series
   differ by a few entries; an allocation missing from a run keeps the template's size. The blocks live at the first
   trace entry (the weights, mostly) are matched the same way, in address order.
2. Fit: each matched allocation's requested size as a function of the size parameter s: the fewest terms of
   a + b*s + c*s^2 that give every run's size (constant, c*s, c*s^2 first, then with a constant term). A fit with as
   many terms as runs checks nothing; one whose predicted size is negative, or a size that goes down and up again,
   is unstable, and is said to be (with three or more runs the extra runs check the fit).
3. Build: the template's trace, each allocation at its fitted size at the target, its frees where the template
   freed it (minialloc.trace.DeviceTrace, so every replay tool reads it).
4. Replay: from the fitted live blocks at the first entry (minialloc.relay.relay_start, the re-laid start), under
   the recorded settings and each what-if config (minialloc.replay.replay_trace, relaid=True), and the smallest
   device each fits on (minialloc.replay.smallest_capacity).

Peak allocated is counted as torch.cuda.max_memory_allocated counts it (block sizes, after rounding and unsplit
tails); peak requested is the bytes the program asked for. Peak reserved also depends on what the process cached
before its trace began, which no file at another size shows: it is the re-laid start's (live blocks only) plus
the trace's own growth. bench/scale.py measures the error against real runs of the shared series.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .lang import messages, say
from .replay import (
    DEFAULT_WHAT_IF,
    ReplayResult,
    check_capacity,
    check_configs,
    load_trace_file,
    replay_trace,
    smallest_capacity,
)
from .sizes import readable_size
from .trace import (
    FREE,
    MALLOC,
    DeviceTrace,
    TraceError,
    read_device_trace,
    recorded_config,
    top_user_frame,
    user_frames,
    why_not_replayable,
)

# What `minialloc scale` prints for a person, in the notebook's (or MINIALLOC_LANG's) language: minialloc.lang.
# --json keeps English keys.
TEXT = messages("minialloc.scale.TEXT", {
    "header": "{runs} runs of one program at sizes {sizes}, predicted at {target}",
    "matched": "{matched} of {total} allocations of the largest run matched in every run by stack frames and order "
               "(the others keep their size there); {start} of {start_total} blocks live at the first trace entry "
               "matched by frames (the others keep their size)",
    "fits": "per-allocation fits: {kinds}",
    "fits_checked": "every fit is checked by a spare run",
    "fits_unchecked": "{n} fits have as many terms as there are runs: no spare run checks them",
    "fits_two_runs": "two runs give each fit one point to spare at most: give a third run to check them",
    "unstable": "unstable: {n} fits are not one term of the size (c, c*s or c*s^2) checked by a spare run, or the "
                "size goes down and up again; their sizes at {target} are guesses (e.g. {examples})",
    "table_heading": "at {target}, replayed from the live blocks at the first entry under each setting:",
    "col_config": "config",
    "col_peak_alloc": "peak alloc",
    "col_peak_reserved": "peak reserv",
    "col_ooms": "OOMs",
    "col_fits_on": "fits on",
    "requested": "peak requested {requested}; peak allocated {allocated} (as torch.cuda.max_memory_allocated "
                 "counts it); a straight line through the two largest runs' peaks allocated says {line}",
    "reserved_note": "peak reserved also depends on what the process cached before its trace began, which no run "
                     "at another size shows",
    "growth_heading": "fastest-growing allocations (the largest of each stack, at {largest} -> at {target}):",
    "growth_row": "{before} -> {after}  {fit}, {count} allocations  {where}",
    "fits_on": "verdict: under the recorded settings ({config}) the run at {target} fits on a device of {size} "
               "(peak reserved {reserved})",
    "peaks_at": "verdict: under the recorded settings ({config}) the run at {target} peaks at {reserved} reserved "
                "(--no-fit: the smallest device it fits on was not searched)",
    "fits_capacity": "verdict: the run at {target} fits in {capacity} under the recorded settings ({config}), peak "
                     "reserved {reserved}",
    "fails_capacity": "verdict: the run at {target} does NOT fit in {capacity} under the recorded settings "
                      "({config}): trace entry {entry} fails",
    "saved_by": "  {names} would fit in it",
    "fit_constant": "constant",
    "fit_linear": "linear",
    "fit_quadratic": "quadratic",
    "fit_linear_constant": "linear + constant",
    "fit_quadratic_constant": "quadratic + constant",
    "fit_quadratic_linear": "quadratic + linear",
    "fit_quadratic_linear_constant": "quadratic + linear + constant",
    "none_saves": "  no setting tried fits it",
})

# an allocation's exact size is an integer number of bytes: a fit that misses a run by more than this is no fit
_TOLERANCE = 1e-6
# below this share of the template's allocations matched in every run, the files are not one program's runs
MIN_MATCHED = 0.8
# the model's terms, fewest first: (names of the powers of s used)
_MODELS: tuple[tuple[int, ...], ...] = ((0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2))
MODEL_NAMES = {(0,): "constant", (1,): "linear", (2,): "quadratic", (0, 1): "linear + constant",
               (0, 2): "quadratic + constant", (1, 2): "quadratic + linear", (0, 1, 2): "quadratic + linear + constant"}


class ScaleError(ValueError):
    """Runs that cannot be scaled (one line: what is wrong and what to do)."""


@dataclass
class Fit:
    """One allocation's size as a function of the size parameter s."""

    powers: tuple[int, ...]
    coefficients: tuple[float, ...]
    checked: bool  # the runs hold more points than the fit has terms: the spare ones agree with it
    unstable: bool = False

    def at(self, s: float) -> int:
        return max(0, round(sum(c * s ** p for p, c in zip(self.powers, self.coefficients, strict=True))))

    @property
    def name(self) -> str:
        return MODEL_NAMES[self.powers]

    @property
    def degree(self) -> int:
        return max(p for p, c in zip(self.powers, self.coefficients, strict=True) if c) if any(
            self.coefficients) else 0


def fit_sizes(xs: Sequence[float], ys: Sequence[int]) -> Fit:
    """The fewest-term polynomial in s (powers 0..2) through every (s, size) point; unstable when none is checked by
    a spare point and it is not a single term, or when it predicts a negative size at a given s."""
    n = len(xs)
    if len(set(ys)) == 1:
        return Fit((0,), (float(ys[0]),), checked=n > 1)
    for powers in _MODELS:
        k = len(powers)
        if k > n:
            break
        if 0 in powers and k == 1:
            continue  # the sizes differ: not constant
        coefficients = _solve([[x ** p for p in powers] for x in xs[:k]], [float(y) for y in ys[:k]])
        if coefficients is None:
            continue
        if all(abs(sum(c * x ** p for p, c in zip(powers, coefficients, strict=True)) - y) <= max(1.0, y * _TOLERANCE)
               for x, y in zip(xs, ys, strict=True)):
            checked = k < n
            fit = Fit(powers, tuple(coefficients), checked)
            # a single term (c*s, c*s^2) is the shape tensors have; two terms through two points check nothing
            fit.unstable = (not checked and k > 1) or not _monotone(ys)
            return fit
    # nothing with at most n terms goes through every point (three or more runs disagree with any quadratic):
    # the least-squares quadratic, said to be unstable
    powers = (0, 1, 2) if n >= 3 else (0, 1)
    coefficients = _least_squares(xs, ys, powers)
    return Fit(powers, tuple(coefficients), checked=False, unstable=True)


def _monotone(ys: Sequence[int]) -> bool:
    steps = [b - a for a, b in zip(ys, ys[1:], strict=False)]
    return all(d >= 0 for d in steps) or all(d <= 0 for d in steps)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting (at most 3 unknowns); None for a singular system."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12 * max(1.0, max(abs(v) for v in m[pivot][:n])):
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [v - f * w for v, w in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def _least_squares(xs: Sequence[float], ys: Sequence[int], powers: tuple[int, ...]) -> list[float]:
    a = [[x ** p for p in powers] for x in xs]
    ata = [[sum(row[i] * row[j] for row in a) for j in range(len(powers))] for i in range(len(powers))]
    aty = [sum(row[i] * y for row, y in zip(a, ys, strict=True)) for i in range(len(powers))]
    return _solve(ata, aty) or [float(sum(ys)) / len(ys)] + [0.0] * (len(powers) - 1)


# -- reading and matching the runs -----------------------------------------------------------------------------
@dataclass
class Run:
    """One run of the series: its file, size parameter, recorded settings and device trace."""

    path: str
    size: float
    config: str
    trace: DeviceTrace
    alloc_entries: list[int] = field(default_factory=list)  # trace entry index of each allocation, in order
    alloc_keys: list[str] = field(default_factory=list)
    start_blocks: list[dict] = field(default_factory=list)  # live at the first entry, in address order
    start_keys: list[str] = field(default_factory=list)

    @property
    def has_frames(self) -> bool:
        return any(self.trace.entries[i].get("frames") for i in self.alloc_entries[:200])


def _key(frames: Sequence[dict] | None, stream: int) -> str:
    """What names an allocation across runs: its stream and its user frames' functions and files (or the autograd
    node, or nothing when no frame was recorded). Line numbers are left out: the runs of a series are often made
    from different commits of the same program, where an edit above a line moves it; the order tells apart two
    allocations of one function."""
    own = [f"{f.get('name', '')} ({Path(str(f.get('filename', ''))).name})" for f in frames or ()
           if str(f.get("filename", "")).endswith(".py") and "site-packages" not in str(f.get("filename", ""))
           and "/torch/" not in str(f.get("filename", ""))][:6]
    if not own and frames:
        own = [top_user_frame(frames)]
    return f"{stream}|" + "|".join(own)


def read_run(path: str, size: float, device: int | None = None) -> Run:
    snap = load_trace_file(path)
    from .trace import devices

    found = [d for d in (devices(snap) if device is None else [device]) if why_not_replayable(snap, d) is None]
    if not found:
        reasons = [why_not_replayable(snap, d) for d in (devices(snap) if device is None else [device])]
        raise ScaleError(f"{path}: {next((r for r in reasons if r), 'no trace to scale')}")
    if len(found) > 1:
        raise ScaleError(f"{path}: traces for devices {', '.join(map(str, found))}: pick one with --device")
    trace = read_device_trace(snap, found[0], path)
    run = Run(path, size, recorded_config(snap), trace)
    for i, e in enumerate(trace.entries):
        if e.get("action") == "alloc":
            run.alloc_entries.append(i)
            run.alloc_keys.append(_key(e.get("frames"), int(e.get("stream", 0))))
    for seg in sorted(trace.start_segments, key=lambda s: s["address"]):
        for b in sorted(seg["blocks"], key=lambda b: b["address"]):
            if b["state"] == "active_allocated":
                run.start_blocks.append(b)
                run.start_keys.append(_key(b.get("frames"), int(seg.get("stream", 0))))
    return run


def match(template: Sequence[str], other: Sequence[str]) -> dict[int, int]:
    """Index in `template` -> index in `other` for the items difflib pairs (same key, same order)."""
    pairs: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(None, template, other, autojunk=False)
    for a, b, n in matcher.get_matching_blocks():
        for k in range(n):
            pairs[a + k] = b + k
    return pairs


@dataclass
class Growth:
    """The allocations of one stack: how many, the fastest-growing one's size at the largest run and at the
    target, and the fit of highest degree among them."""

    where: str
    count: int
    fit: str
    at_largest: int
    at_target: int


@dataclass
class ScalePrediction:
    """What `minialloc scale` prints: the replayed peaks at the target size, per config, and how the fits went."""

    sizes: list[float]
    target: float
    files: list[str]
    recorded_config: str
    capacity: int | None
    peak_requested: int
    rows: list[ReplayResult]
    allocations: int
    matched: int
    fits: dict[str, int]  # fit name -> allocations
    unstable: int
    unchecked: int
    unstable_examples: list[str]
    growth: list[Growth]
    start_blocks_matched: tuple[int, int]
    straight_line_peak: int  # the line through the two largest runs' own peaks allocated, at the target

    @property
    def recorded(self) -> ReplayResult:
        return self.rows[0]

    @property
    def peak_allocated(self) -> int:
        return self.recorded.peak_allocated

    @property
    def peak_reserved(self) -> int:
        return self.recorded.peak_reserved

    @property
    def fits_on(self) -> int | None:
        return self.recorded.fits_on

    def as_dict(self) -> dict:
        return {
            "files": self.files, "sizes": self.sizes, "target": self.target,
            "recorded_config": self.recorded_config or "native", "capacity": self.capacity,
            "peak_requested": self.peak_requested, "peak_allocated": self.peak_allocated,
            "peak_reserved": self.peak_reserved, "fits_on": self.fits_on,
            "fits": None if self.capacity is None else not self.recorded.failed,
            "straight_line_peak_allocated": self.straight_line_peak,
            "allocations": self.allocations, "matched": self.matched, "fit_kinds": self.fits,
            "unstable_fits": self.unstable, "unchecked_fits": self.unchecked,
            "start_blocks_matched": list(self.start_blocks_matched),
            "fastest_growing": [g.__dict__ for g in self.growth],
            "configs": [{"config": r.config, "peak_allocated": r.peak_allocated, "peak_reserved": r.peak_reserved,
                         "ooms": r.ooms, "first_failure_entry": r.first_failure_entry, "fits_on": r.fits_on}
                        for r in self.rows],
        }


def recorded_peak_allocated(run: Run) -> int:
    """The run's own peak allocated (a replay under its recorded settings, every block where the run put it)."""
    result, _ = replay_trace(run.trace, run.config, at_recorded=True)
    return result.peak_allocated


def scale(paths: Sequence[str], sizes: Sequence[float], target: float, *, configs: Sequence[str] = (),
          capacity: int | None = None, device: int | None = None, fit: bool = True,
          runs: Sequence[Run] | None = None) -> ScalePrediction:
    """Predict the run at size `target` from the runs in `paths` at `sizes` (see the module docstring)."""
    check_capacity(capacity)
    check_configs(configs)
    if len(paths) != len(sizes):
        raise ScaleError(f"{len(paths)} files but {len(sizes)} sizes: give one size per file (--sizes 128,256)")
    if len(paths) < 2:
        raise ScaleError("give two or more runs of the same program at different sizes")
    if len(set(sizes)) != len(sizes) or any(s <= 0 for s in sizes) or target <= 0:
        raise ScaleError(f"sizes must be distinct and positive, got {', '.join(map(_num, sizes))} (target "
                         f"{_num(target)})")
    if runs is None:
        runs = [read_run(p, s, device) for p, s in zip(paths, sizes, strict=True)]
    runs = sorted(runs, key=lambda r: r.size)
    template = runs[-1]  # the largest: the nearest to a larger target, its trace the model of the new one
    configs_seen = {r.config for r in runs}
    if len(configs_seen) > 1:
        raise ScaleError("the runs were recorded under different allocator settings ("
                         + "; ".join(f"{Path(r.path).name}: {r.config or 'native'}" for r in runs)
                         + "): scale runs made under the same settings")
    for r in runs:
        if not r.has_frames:
            raise ScaleError(f"{r.path}: its trace has no stack frames, so its allocations cannot be matched with "
                             "the other runs'; record them with torch.cuda.memory._record_memory_history("
                             "stacks='python') (the default records them)")
    others = runs[:-1]
    pairs = [match(template.alloc_keys, r.alloc_keys) for r in others]
    n = len(template.alloc_keys)
    for r, p in zip(others, pairs, strict=True):
        share = len(p) / max(1, n)
        if share < MIN_MATCHED:
            raise ScaleError(f"{r.path} and {template.path} do not look like runs of the same program: only "
                             f"{len(p)} of {n} allocations match by stack frames and order (needs "
                             f"{MIN_MATCHED:.0%})")
    xs = [r.size for r in runs]
    sizes_at_target: dict[int, int] = {}  # template entry index -> predicted size
    fit_counts: dict[str, int] = {}
    unstable = unchecked = matched = 0
    unstable_examples: list[str] = []
    growth: dict[str, Growth] = {}
    for k, i in enumerate(template.alloc_entries):
        own = int(template.trace.entries[i]["size"])
        if not all(k in p for p in pairs):
            sizes_at_target[i] = own
            continue
        matched += 1
        ys = [int(r.trace.entries[r.alloc_entries[p[k]]]["size"]) for r, p in zip(others, pairs, strict=True)]
        f = fit_sizes(xs, [*ys, own])
        sizes_at_target[i] = f.at(target)
        fit_counts[f.name] = fit_counts.get(f.name, 0) + 1
        unchecked += not f.checked
        if f.unstable:
            unstable += 1
            if len(unstable_examples) < 3:
                unstable_examples.append(f"{_where(template, i)}: {', '.join(map(str, [*ys, own]))} bytes")
        where = _where(template, i)
        g = growth.setdefault(where, Growth(where, 0, f.name, 0, 0))
        g.count += 1
        if sizes_at_target[i] - own > g.at_target - g.at_largest:  # the stack's fastest-growing allocation
            g.at_largest, g.at_target = own, sizes_at_target[i]
        if f.degree > MODEL_DEGREE.get(g.fit, 0):
            g.fit = f.name
    start_pairs = [match(template.start_keys, r.start_keys) for r in others]
    start_matched = 0
    start_segments = []
    for seg in template.trace.start_segments:
        blocks = []
        for b in seg["blocks"]:
            blocks.append(dict(b))
        start_segments.append(dict(seg, blocks=blocks))
    by_address = {b["address"]: b for seg in start_segments for b in seg["blocks"]}
    for k, b in enumerate(template.start_blocks):
        # a block with no frame is matched by nothing but its place in address order, which another run's
        # layout does not keep: it keeps the template's size (the weights, mostly, which do not grow)
        if template.start_keys[k].endswith("|") or not all(k in p for p in start_pairs):
            continue
        start_matched += 1
        ys = [int(r.start_blocks[p[k]]["requested_size"]) for r, p in zip(others, start_pairs, strict=True)]
        f = fit_sizes(xs, [*ys, int(b["requested_size"])])
        by_address[b["address"]]["requested_size"] = f.at(target)
    synthetic = _synthetic_trace(template.trace, sizes_at_target, start_segments)
    peak_requested = _peak_requested(synthetic)
    rows = []
    for conf in dict.fromkeys([template.config, *configs]):
        result, _ = replay_trace(synthetic, conf, capacity, relaid=True, cache=False,
                                 label=f"{conf or 'native'} at {_num(target)}")
        result.relaid = True
        if fit:
            unlimited = result if capacity is None else replay_trace(synthetic, conf, None, relaid=True,
                                                                     cache=False)[0]
            result.fits_on = smallest_capacity(synthetic, conf, unlimited, relaid=True, cache=False)
        rows.append(result)
    top = sorted(growth.values(), key=lambda g: g.at_target - g.at_largest, reverse=True)[:5]
    line = _straight_line(runs, target)
    return ScalePrediction(
        sizes=[r.size for r in runs], target=target, files=[r.path for r in runs], recorded_config=template.config,
        capacity=capacity, peak_requested=peak_requested, rows=rows, allocations=n, matched=matched,
        fits=fit_counts, unstable=unstable, unchecked=unchecked, unstable_examples=unstable_examples,
        growth=[g for g in top if g.at_target > g.at_largest],
        start_blocks_matched=(start_matched, len(template.start_blocks)), straight_line_peak=line)


MODEL_DEGREE = {name: max(powers) for powers, name in MODEL_NAMES.items()}


def _straight_line(runs: Sequence[Run], target: float) -> int:
    """The straight line through the two largest runs' own peaks allocated, at the target (the guess scale
    replaces; bench/scale.py prints its error beside scale's)."""
    a, b = runs[-2], runs[-1]
    pa, pb = recorded_peak_allocated(a), recorded_peak_allocated(b)
    return round(pb + (pb - pa) * (target - b.size) / (b.size - a.size))


def _where(run: Run, i: int) -> str:
    frames = run.trace.entries[i].get("frames")
    # the standard library's frames (contextlib's wrappers) say nothing about the program
    own = [f for f in user_frames(frames, limit=4) if not f.startswith(("inner (contextlib", "__call__ (contextlib",
                                                                          "__exit__ (contextlib"))][:2]
    return "; ".join(own) if own else top_user_frame(frames)


def _synthetic_trace(template: DeviceTrace, sizes: dict[int, int], start_segments: list[dict]) -> DeviceTrace:
    """The template's trace with each allocation at its predicted size (frees where the template freed), as a
    DeviceTrace whose start is the live blocks at the first entry, at their predicted sizes."""
    ops = []
    for op in template.ops:
        kind, i, size, stream, addr, _ = op
        if kind == MALLOC:
            ops.append((MALLOC, i, sizes.get(i, size), stream, addr, ()))
        elif kind == FREE:
            ops.append(op)
        # an 'oom' entry is a request a smaller run could not serve, and a release run depended on that run's
        # device: at the target the capacity asked for decides both
    return DeviceTrace(template.device, template.entries, ops, start_segments, 0, 0, [], [], False,
                       pool_of=dict(template.pool_of))


def _peak_requested(trace: DeviceTrace) -> int:
    """The most bytes the program asked for at once: the live blocks at the first entry, then the trace's."""
    live = dict(trace.live_at_start)
    now = peak = sum(live.values())
    for kind, _, size, _, addr, _ in trace.ops:
        if kind == MALLOC:
            live[addr] = size
            now += size
            peak = max(peak, now)
        elif kind == FREE and addr in live:
            now -= live.pop(addr)
    return peak


def report(p: ScalePrediction) -> str:
    """The prediction as a person reads it (see TEXT)."""
    target = _num(p.target)
    lines = [say(TEXT, "header", runs=len(p.sizes), sizes=", ".join(map(_num, p.sizes)), target=target),
             say(TEXT, "matched", matched=p.matched, total=p.allocations, start=p.start_blocks_matched[0],
                 start_total=p.start_blocks_matched[1]),
             say(TEXT, "fits", kinds=", ".join(f"{n} {_fit_name(name)}" for name, n in sorted(p.fits.items(),
                                                                                   key=lambda kv: -kv[1])))]
    if len(p.sizes) == 2:
        lines.append(say(TEXT, "fits_two_runs"))
    else:
        lines.append(say(TEXT, "fits_unchecked", n=p.unchecked) if p.unchecked else say(TEXT, "fits_checked"))
    if p.unstable:
        lines.append(say(TEXT, "unstable", n=p.unstable, target=target, examples="; ".join(p.unstable_examples)))
    lines += ["", say(TEXT, "table_heading", target=target)]
    head = tuple(say(TEXT, f"col_{c}") for c in ("config", "peak_alloc", "peak_reserved", "ooms", "fits_on"))
    widths = tuple(max(w, len(h)) for w, h in zip((max(32, *(len(r.config) for r in p.rows)), 12, 12, 6, 12), head,
                                                  strict=True))
    lines.append(_row(head, widths))
    for r in p.rows:
        cells = (r.config, readable_size(r.peak_allocated), readable_size(r.peak_reserved), str(r.ooms),
                 "-" if r.fits_on is None else readable_size(r.fits_on))
        lines.append(_row(cells, widths))
    lines += ["", say(TEXT, "requested", requested=readable_size(p.peak_requested),
                      allocated=readable_size(p.peak_allocated), line=readable_size(max(0, p.straight_line_peak))),
              say(TEXT, "reserved_note")]
    if p.growth:
        lines += ["", say(TEXT, "growth_heading", largest=_num(p.sizes[-1]), target=target)]
        lines += ["  " + say(TEXT, "growth_row", before=readable_size(g.at_largest).rjust(10),
                             after=readable_size(g.at_target).rjust(10), fit=_fit_name(g.fit), count=g.count,
                             where=g.where)
                  for g in p.growth]
    lines.append("")
    config = p.recorded_config or "native"
    r = p.recorded
    if p.capacity is None:
        if r.fits_on is not None:
            lines.append(say(TEXT, "fits_on", config=config, target=target, size=readable_size(r.fits_on),
                             reserved=readable_size(r.peak_reserved)))
        else:
            lines.append(say(TEXT, "peaks_at", config=config, target=target, reserved=readable_size(r.peak_reserved)))
    elif not r.failed:
        lines.append(say(TEXT, "fits_capacity", target=target, capacity=readable_size(p.capacity), config=config,
                         reserved=readable_size(r.peak_reserved)))
    else:
        lines.append(say(TEXT, "fails_capacity", target=target, capacity=readable_size(p.capacity), config=config,
                         entry=r.first_failure_entry))
        saved = [row.config for row in p.rows[1:] if not row.failed]
        lines.append(say(TEXT, "saved_by", names=", ".join(saved)) if saved else say(TEXT, "none_saves"))
    return "\n".join(lines)


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    """The first cell left-aligned, the figures right-aligned, two spaces between."""
    return "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths, strict=True)))


def _fit_name(name: str) -> str:
    """A fit's name (MODEL_NAMES, English in the JSON) as a person reads it."""
    return say(TEXT, "fit_" + name.replace(" + ", "_").replace(" ", "_"))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def parse_sizes(text: str) -> list[float]:
    """--sizes 128,256[,512]: one positive number per file."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ScaleError(f"--sizes {text!r}: give numbers separated by commas, e.g. --sizes 128,256") from None
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise ScaleError(f"--sizes {text!r}: give positive numbers separated by commas, e.g. --sizes 128,256")
    return values


__all__ = ["DEFAULT_WHAT_IF", "Fit", "Run", "ScaleError", "ScalePrediction", "TraceError", "fit_sizes", "match",
           "parse_sizes", "read_run", "report", "scale"]
