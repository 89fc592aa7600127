"""How well `minialloc scale` predicts a real run's peak at a larger size, beside a straight line through two peaks.

A series is the same program's snapshots at several sizes, in one folder, named alike but for the size
(`..._ctx128_...`, `..._cl256_...`, `..._seq512_...`). For each series, every pair of runs (and the three smallest,
when a fourth is larger) predicts every larger run at twice or four times the largest given size; the error is
against that run's own peak allocated (its trace replayed at the recorded addresses, as torch.cuda's
max_memory_allocated counts it). The straight line goes through the two largest given runs' peaks.

    python bench/scale.py                      # the series in tests/fixtures/series
    python bench/scale.py --series DIR         # every series in DIR
    python bench/scale.py --quick              # the two smallest runs of each series only
"""

from __future__ import annotations

import itertools
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minialloc.scale import ScaleError, read_run, recorded_peak_allocated, scale  # noqa: E402
from minialloc.sizes import readable_size  # noqa: E402
from minialloc.timing import bench_parser  # noqa: E402
from minialloc.trace import TraceError  # noqa: E402

SIZE = re.compile(r"(ctx|cl|seq|context|len)(\d+)")


def series_in(folder: Path) -> dict[str, dict[int, Path]]:
    """name (the file name with the size taken out) -> size -> file."""
    found: dict[str, dict[int, Path]] = {}
    for path in sorted(folder.glob("*.pickle")):
        m = SIZE.search(path.name)
        if m:
            name = path.name[:m.start(2)] + "N" + path.name[m.end(2):]
            found.setdefault(name.removesuffix(".pickle"), {})[int(m.group(2))] = path
    return {k: v for k, v in found.items() if len(v) >= 2}


def cases(sizes: list[int], quick: bool = False) -> list[tuple[tuple[int, ...], int]]:
    """(given sizes, target) for every target at 2x or 4x the largest given size that a run holds (--quick: the
    two smallest runs only)."""
    out = []
    givens = list(itertools.combinations(sizes, 2)) + ([tuple(sizes[:3])] if len(sizes) >= 4 else [])
    if quick:
        givens = givens[:1]
    for given in givens:
        for factor in (2, 4):
            if given[-1] * factor in sizes:
                out.append((given, given[-1] * factor))
    return out


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--series", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "fixtures"
                        / "series", help="a folder of series (default: tests/fixtures/series)")
    args = parser.parse_args()
    runs: dict[Path, object] = {}
    truths: dict[Path, int] = {}
    print(f"{'series':44} {'given':>16} {'to':>6} {'x':>3} {'real peak':>11} {'scale':>11} {'error':>7} "
          f"{'line':>7} {'s':>5}")
    errors: dict[int, list[float]] = {2: [], 4: []}
    line_errors: dict[int, list[float]] = {2: [], 4: []}
    for name, files in series_in(args.series).items():
        sizes = sorted(files)
        todo = cases(sizes, args.quick)
        if not todo:
            try:  # still predicted at 2x the largest, to show it runs (or why it refuses)
                p = scale([str(files[s]) for s in sizes], sizes, 2 * sizes[-1], fit=False)
                said = f"predicted at {2 * sizes[-1]}: peak allocated {readable_size(p.peak_allocated)}"
            except (ScaleError, TraceError) as e:
                said = f"refused: {e}"
            print(f"{name:44} sizes {', '.join(map(str, sizes))}: no run at 2x or 4x a given one to compare with; "
                  + said)
            continue
        for given, target in todo:
            t0 = time.perf_counter()
            try:
                for s in (*given, target):
                    if files[s] not in runs:
                        runs[files[s]] = read_run(str(files[s]), s)
                if files[target] not in truths:
                    truths[files[target]] = recorded_peak_allocated(runs[files[target]])
                p = scale([str(files[s]) for s in given], list(given), target, fit=False,
                          runs=[runs[files[s]] for s in given])
            except (ScaleError, TraceError) as e:
                print(f"{name:44} {','.join(map(str, given)):>16} {target:>6}: refused: {e}")
                break
            truth = truths[files[target]]
            err, line = p.peak_allocated / truth - 1, p.straight_line_peak / truth - 1
            factor = target // given[-1]
            errors[factor].append(abs(err))
            line_errors[factor].append(abs(line))
            print(f"{name:44} {','.join(map(str, given)):>16} {target:>6} {factor:>3} {readable_size(truth):>11} "
                  f"{readable_size(p.peak_allocated):>11} {err:>+7.2%} {line:>+7.1%} {time.perf_counter() - t0:>5.1f}"
                  + (f"  (unstable fits: {p.unstable})" if p.unstable else ""))
    for factor in (2, 4):
        if errors[factor]:
            print(f"at {factor}x: worst error {max(errors[factor]):.2%} over {len(errors[factor])} predictions "
                  f"(goal {5 if factor == 2 else 10}%); the straight line's worst {max(line_errors[factor]):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
