"""minialloc scale on a real series (tests/fixtures/series: one program at context 128, 512, 1024 and 2048): the
smaller runs predict the larger ones' peaks, replayed through the allocator, against the real runs' own peaks."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from minialloc.cli import main
from minialloc.scale import ScaleError, fit_sizes, read_run, recorded_peak_allocated, scale

SERIES = Path(__file__).parent / "fixtures" / "series"
OTHER_PROGRAM = Path(__file__).parent / "fixtures" / "real_snapshots" / "wedsonlin-medium1024-inference.pickle"


def series_file(context: int) -> str:
    return str(SERIES / f"linyun-xl_ctx{context}_forward_none.pickle")


@cache
def run(context: int):
    return read_run(series_file(context), context)


@cache
def truth(context: int) -> int:
    return recorded_peak_allocated(run(context))


def predict(given: tuple[int, ...], target: int, **kw):
    return scale([series_file(c) for c in given], list(given), target, runs=[run(c) for c in given], **kw)


@pytest.mark.parametrize(("given", "target", "bound"), [
    ((128, 512), 1024, 0.05),  # twice the larger size
    ((128, 512), 2048, 0.10),  # four times
    ((128, 512, 1024), 2048, 0.05),  # three runs, twice the largest
])
def test_peak_allocated_within_the_goal_of_the_real_run(given, target, bound):
    p = predict(given, target, fit=False)
    assert p.matched == p.allocations  # one program: every allocation found in every run
    assert abs(p.peak_allocated / truth(target) - 1) <= bound
    # and better than the straight line through the two largest runs' peaks, which misses at 4x by a quarter
    assert abs(p.peak_allocated - truth(target)) < abs(p.straight_line_peak - truth(target))
    assert p.peak_requested <= p.peak_allocated <= p.peak_reserved


def test_three_runs_check_every_fit_and_name_the_quadratic_growth():
    p = predict((128, 512, 1024), 2048, fit=False)
    assert p.unchecked == 0 and p.unstable == 0
    assert p.fits.get("quadratic", 0) > 0 and p.fits.get("linear", 0) > 0
    top = p.growth[0]
    assert top.fit == "quadratic" and top.at_target == 4 * top.at_largest  # attention's scores: s^2
    assert "attention" in top.where


def test_fits_on_and_capacity_verdict_follow_the_replay():
    p = predict((128, 512), 2048)
    assert p.fits_on is not None and p.peak_allocated <= p.fits_on <= p.peak_reserved + (2 << 20)
    small = predict((128, 512), 2048, capacity=p.fits_on - (256 << 20), fit=False)
    assert small.recorded.failed
    roomy = predict((128, 512), 2048, capacity=p.fits_on, fit=False)
    assert not roomy.recorded.failed


def test_fit_sizes_picks_the_fewest_terms_and_says_when_unstable():
    assert fit_sizes([128, 256], [1000, 1000]).name == "constant"
    linear = fit_sizes([128, 256], [128 * 40, 256 * 40])
    assert linear.name == "linear" and linear.checked and not linear.unstable and linear.at(1024) == 1024 * 40
    square = fit_sizes([128, 256, 512], [128 ** 2 * 4, 256 ** 2 * 4, 512 ** 2 * 4])
    assert square.name == "quadratic" and square.checked and square.at(1024) == 1024 ** 2 * 4
    two_terms = fit_sizes([128, 256], [5000, 7000])  # a + b*s through two points: nothing left to check it
    assert two_terms.name == "linear + constant" and two_terms.unstable
    wobbly = fit_sizes([128, 256, 512], [4000, 1000, 9000])  # down then up: no size of a tensor does that
    assert wobbly.unstable


def test_cli_json_gives_the_peaks_in_bytes(capsys):
    status = main(["scale", series_file(128), series_file(512), "--sizes", "128,512", "--to", "1024", "--json",
                   "--no-fit", "--conf", "expandable_segments:True"])
    out = json.loads(capsys.readouterr().out)
    assert status == 0
    for key in ("peak_requested", "peak_allocated", "peak_reserved", "fits_on"):
        assert key in out
    assert abs(out["peak_allocated"] / truth(1024) - 1) <= 0.05
    assert [c["config"] for c in out["configs"]] == ["native", "expandable_segments:True"]


def test_cli_text_names_the_verdict_and_the_growth(capsys):
    status = main(["scale", series_file(128), series_file(512), "--sizes", "128,512", "--to", "2048",
                   "--capacity", "16GiB", "--no-fit", "--conf", "expandable_segments:True"])
    out = capsys.readouterr().out
    assert status == 1  # it does not fit: about 21 GiB are needed
    assert "does NOT fit in 16.00 GiB" in out and "quadratic" in out and "attention" in out


@pytest.mark.parametrize(("argv", "says"), [
    (["--sizes", "128"], "2 files but 1 sizes"),
    (["--sizes", "128,128"], "distinct"),
    (["--sizes", "128,abc"], "--sizes"),
])
def test_bad_sizes_get_one_line(capsys, argv, says):
    status = main(["scale", series_file(128), series_file(512), "--to", "1024", *argv])
    err = capsys.readouterr().err
    assert status == 2 and says in err and len(err.strip().splitlines()) == 1


def test_runs_of_two_programs_are_refused_in_one_line(capsys):
    status = main(["scale", str(OTHER_PROGRAM), series_file(512), "--sizes", "128,512", "--to", "1024"])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "do not look like runs of the same program" in err


def test_runs_without_frames_are_refused(tmp_path):
    import pickle

    snap = pickle.loads(Path(series_file(128)).read_bytes())
    for e in snap["device_traces"][0]:
        e["frames"] = []
    bare = tmp_path / "bare.pickle"
    bare.write_bytes(pickle.dumps(snap))
    with pytest.raises(ScaleError, match="no stack frames"):
        scale([str(bare), series_file(512)], [128, 512], 1024, fit=False)
