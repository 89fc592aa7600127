"""How fast are minialloc's pictures on a long trace?  python bench/viz_bench.py [--quick] [--events N] [--check]

Targets (issue "Seeing memory"): one step of the stepper under 200 ms on a 100,000-event trace, whatever the
direction of the move; the static plots (segment map, timeline, PNG + SVG files) in a few seconds.
Prints one line per measurement; --check exits 1 when a median misses its target.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
from collections.abc import Callable

os.environ.setdefault("MPLBACKEND", "Agg")

from minialloc import CachingAllocator, SimulatedGPU  # noqa: E402
from minialloc.oom import OutOfMemoryError  # noqa: E402
from minialloc.timing import bench_parser, once  # noqa: E402
from minialloc.viz import Stepper, plot_segment_map, plot_timeline, random_events, save_plots  # noqa: E402

STEP_TARGET_S = 0.200
STATIC_TARGET_S = 5.0


def timed(fn: Callable[[], object]) -> float:
    return once(fn)[1]


def report(name: str, times: list[float], target: float | None = None) -> bool:
    med = statistics.median(times)
    ok = target is None or med <= target
    verdict = "" if target is None else f"  target {target * 1000:.0f} ms: {'ok' if ok else 'MISSED'}"
    spread = ""
    if len(times) > 1:
        spread = f" (min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}, n={len(times)})"
    print(f"{name:<44} median {med * 1000:8.1f} ms{spread}{verdict}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--events", type=int, default=None, help="events in the trace (default 100,000; --quick: "
                        "10,000)")
    parser.add_argument("--repeat", type=int, default=None, help="draws per stepper measurement (default 9; "
                        "--quick: 3)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    n = args.events or (10_000 if args.quick else 100_000)
    args.repeat = args.repeat or (3 if args.quick else 9)
    events = random_events(n, seed=0)
    print(f"{n} events ({sum(1 for e in events if e[0] > 0)} mallocs), capacity 80 GiB, native config")
    ok = True

    build: list[Stepper] = []
    report("stepper: replay all, checkpoints every 1000", [timed(lambda: build.append(Stepper(events, "")))])
    stepper = build[0]
    rng = random.Random(1)
    stepper.frame_png(n // 2, quick=True)  # warm the caches a first draw fills (fonts, text layout)
    moves: dict[str, Callable[[int], int]] = {
        "forward one": lambda k: k + 1,
        "backward one": lambda k: k - 1,
        "random jump": lambda k: rng.randrange(n + 1),
    }
    for name, move in moves.items():
        times = []
        for _ in range(args.repeat):
            target = min(n, max(0, move(stepper.step)))
            times.append(timed(lambda t=target: stepper.frame_png(t, quick=True)))
        ok &= report(f"stepper step ({name}), widget frame", times, STEP_TARGET_S)
    times = [timed(lambda: stepper.frame_png(rng.randrange(n + 1))) for _ in range(args.repeat)]
    report("stepper step (random jump), full frame", times)
    replay = stepper.replay
    times = [timed(lambda: replay.goto(rng.randrange(n + 1))) for _ in range(args.repeat)]
    report("replay only (random jump), no drawing", times)

    allocator = CachingAllocator(SimulatedGPU("80GiB"), "")
    allocator.record_memory_history(True, max_entries=10 * n)
    report_replay = timed(lambda: _replay_into(allocator, events))
    snapshot = allocator.snapshot()
    entries = len(snapshot["device_traces"][0])
    report(f"replay with history ({entries} trace entries)", [report_replay])
    statics: dict[str, Callable[[], object]] = {
        "static: segment map (build, no render)": lambda: plot_segment_map(snapshot),
        "static: timeline (build, no render)": lambda: plot_timeline(snapshot),
    }
    with tempfile.TemporaryDirectory() as out:
        statics["static: save_plots (build + render PNG, SVG)"] = lambda: save_plots(snapshot, out)
        for name, fn in statics.items():
            ok &= report(name, [timed(fn)], STATIC_TARGET_S)
    return 1 if args.check and not ok else 0


def _replay_into(allocator: CachingAllocator, events: list[tuple[int, int, str]]) -> None:
    """The stepper's replay, by hand, with the trace history on (the stepper keeps none)."""
    live: dict[str, int] = {}
    for size, stream, label in events:
        if size > 0:
            try:
                live[label] = allocator.malloc(size, stream)
            except OutOfMemoryError:
                pass
        elif label in live:
            allocator.free(live.pop(label))


if __name__ == "__main__":
    sys.exit(main())
