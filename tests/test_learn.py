"""The course harness (minialloc.learn): predictions compared fairly, exercises checked, nothing ever raises."""

from __future__ import annotations

from typing import Any

import pytest

from minialloc import MiB, learn


@pytest.fixture(autouse=True)
def _fresh() -> None:
    learn.reset()


def test_blank_prediction_reveals_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    text = learn.reveal("p", ..., 12345, "the secret reason")
    out = capsys.readouterr().out
    assert "not yet" in text and "not yet" in out
    assert "12345" not in out and "secret" not in out  # the answer stays hidden until the learner commits
    assert learn.results() == {"p": "not yet"}


@pytest.mark.parametrize(
    ("guess", "actual", "rel_tol", "status"),
    [
        (20 * MiB, 20 * MiB, 0.0, "right"),
        (20 * MiB + 1, 20 * MiB, 0.0, "wrong"),
        ("20 MiB", 20 * MiB, 0.0, "right"),  # a byte count may be typed with its unit
        ("20 MB", 20 * MiB, 0.0, "wrong"),  # ... and MB is not MiB
        (0.69, 0.6912, 0.01, "right"),
        (0.60, 0.6912, 0.01, "wrong"),
        ("Large  Pool", "large pool", 0.0, "right"),
        ("small pool", "large pool", 0.0, "wrong"),
        ([512, "small"], (512, "small"), 0.0, "right"),
        ((512, "small", 1), (512, "small"), 0.0, "wrong"),
        ([3, 1, 2], {1, 2, 3}, 0.0, "right"),
        ([1, 1, 2], {1, 2, 3}, 0.0, "wrong"),
        (True, True, 0.0, "right"),
        (1, True, 0.0, "wrong"),  # True is not the number 1 here: a yes/no question wants a yes/no answer
        ({"a": 1}, {"a": 1}, 0.0, "right"),
        ("three", 3, 0.0, "wrong"),
        (None, 3, 0.0, "wrong"),
    ],
)
def test_reveal_compares(guess: object, actual: object, rel_tol: float, status: str) -> None:
    learn.reveal("p", guess, actual, "why", rel_tol=rel_tol)
    assert learn.results()["p"] == status


def test_wrong_tuple_names_the_wrong_items(capsys: pytest.CaptureFixture[str]) -> None:
    learn.reveal("p", (512, "large", 2 * MiB), (512, "small", 2 * MiB), "small requests use the small pool")
    out = capsys.readouterr().out
    assert "item 2" in out and "item 1" not in out and "item 3" not in out
    assert "small requests use the small pool" in out


def test_reveal_never_raises_on_odd_objects() -> None:
    class Weird:
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no comparing me")

    learn.reveal("p", 3, Weird(), "why")
    assert learn.results()["p"] == "wrong"


def _doubles(fn: object) -> str:
    for x in (0, 1, 7):
        got = learn.call(fn, x)
        learn.expect(got == 2 * x, f"for {x} your function returned {got!r}", "multiply, do not add")
    return "three inputs"


def test_check_outcomes(capsys: pytest.CaptureFixture[str]) -> None:
    def blank(x: int) -> int:
        raise NotImplementedError  # your code here

    def dots(x: int) -> object:
        return ...

    def wrong(x: int) -> int:
        return x + 2

    def crashes(x: int) -> int:
        return [][x]

    def right(x: int) -> int:
        return 2 * x

    for eid, fn in [("blank", blank), ("dots", dots), ("wrong", wrong), ("crashes", crashes), ("right", right),
                    ("ellipsis", ...)]:
        learn.check(eid, fn, _doubles)
    assert learn.results() == {"blank": "not yet", "dots": "not yet", "wrong": "failed", "crashes": "failed",
                               "right": "passed", "ellipsis": "not yet"}
    out = capsys.readouterr().out
    assert "hint: multiply, do not add" in out
    assert "IndexError" in out and "return [][x]" in out  # the learner's own line is quoted
    assert "passed: three inputs" in out


def test_check_speaks_the_notebook_language(capsys: pytest.CaptureFixture[str]) -> None:
    from minialloc.lang import using

    def wrong(x: int) -> int:
        return x + 2

    def crashes(x: int) -> int:
        return [][x]

    with using("vi"):
        learn.check("wrong", wrong, _doubles)
        learn.check("crashes", crashes, _doubles)
    with using("de"):
        learn.check("blank", ..., _doubles)
    out = capsys.readouterr().out
    assert "[wrong] chưa đạt:" in out and "\ngợi ý: multiply, do not add" in out  # the checker's own words stay
    assert "trong mã của bạn, dòng" in out and "return [][x]" in out
    assert "[blank] noch nicht:" in out
    assert learn.results() == {"wrong": "failed", "crashes": "failed", "blank": "not yet"}  # the same outcomes


def test_latest_outcome_wins() -> None:
    learn.reveal("p", 1, 2, "why")
    learn.reveal("p", 2, 2, "why")
    assert learn.results() == {"p": "right"}


def test_returned_text_is_what_was_printed(capsys: pytest.CaptureFixture[str]) -> None:
    text = learn.reveal("p", 2, 2, "because")
    assert capsys.readouterr().out.strip() == text.strip()
    assert isinstance(text, str)


def test_a_tuple_of_the_wrong_length_says_so_and_sizes_are_shown_in_units(capsys: pytest.CaptureFixture[str]) -> None:
    learn.reveal("p", (1024, "small"), (1024, "small", 2 * MiB), "why")
    out = capsys.readouterr().out
    assert "you gave 2 items, the answer has 3" in out
    assert "that is (1024 bytes, 'small', 2.00 MiB)" in out


# --- the chapter checkers: a right answer passes, plausible wrong ones fail with a hint ---------------------------
def _retry_right(device: Any, cache: list, size: int) -> int:  # the learner's signature, as in chapter 1
    fits = [e for e in cache if e[1] >= size]
    if fits:
        best = min(fits, key=lambda e: (e[1], e[0]))
        cache.remove(best)
        return best[0]
    try:
        return device.malloc(size)
    except MemoryError:
        for address, _ in cache:
            device.free(address)
        cache.clear()
        return device.malloc(size)


def _retry_releases_first(device: Any, cache: list, size: int) -> int:
    for address, _ in cache:
        device.free(address)
    cache.clear()
    return device.malloc(size)


def _retry_never(device: Any, cache: list, size: int) -> int:
    return device.malloc(size)


def _pages_right(offset: int, size: int, page: int) -> range:
    return range(offset // page, (offset + size - 1) // page + 1)


def _pages_one_too_many(offset: int, size: int, page: int) -> range:
    return range(offset // page, (offset + size) // page + 1)  # wrong when the block ends on a page boundary


def _unmap_right(blocks: list, page: int) -> list[int]:
    return [i for off, n, free in blocks if free for i in range(-(-off // page), (off + n) // page)]


def _unmap_touching(blocks: list, page: int) -> list[int]:
    return [i for off, n, free in blocks if free for i in range(off // page, -(-(off + n) // page))]


def _oom_right() -> list:
    from minialloc.workloads import alloc, free

    events = [alloc(f"big{i}", 640 * MiB) for i in range(6)] + [free(f"big{i}") for i in range(6)]
    return events + [alloc(f"act{i}", 330 * MiB) for i in range(6)]


def _oom_all_live() -> list:
    from minialloc.workloads import alloc

    return [alloc("x", 3 * 1024 * MiB + 600 * MiB)]  # fails, but with little free: not fragmentation


def _releasable_right(snapshot: dict) -> int:
    return sum(s["total_size"] for s in snapshot["segments"] if all(b["state"] == "inactive" for b in s["blocks"]))


def _releasable_all_cached(snapshot: dict) -> int:
    return sum(b["size"] for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "inactive")


def _peak_right(alloc: Any, step: Any) -> int:
    alloc.reset_peak_memory_stats()
    step(alloc)
    return alloc.max_memory_allocated()


def _peak_no_reset(alloc: Any, step: Any) -> int:
    step(alloc)
    return alloc.max_memory_allocated()


@pytest.mark.parametrize(
    ("checker", "right", "wrongs"),
    [
        ("chapter1.check_get_segment", _retry_right, [_retry_releases_first, _retry_never]),
        ("chapter1.check_step_peak", _peak_right, [_peak_no_reset]),
        ("chapter2.check_oom_trace", _oom_right, [_oom_all_live]),
        ("chapter2.check_releasable", _releasable_right, [_releasable_all_cached]),
        ("chapter3.check_pages_touched", _pages_right, [_pages_one_too_many]),
        ("chapter3.check_pages_to_unmap", _unmap_right, [_unmap_touching]),
    ],
)
def test_chapter_checkers(checker: str, right: object, wrongs: list, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    module, name = checker.split(".")
    fn = getattr(importlib.import_module(f"minialloc.learn.{module}"), name)
    learn.check("right", right, fn)
    for i, wrong in enumerate(wrongs):
        learn.check(f"wrong{i}", wrong, fn)
    results = learn.results()
    assert results.pop("right") == "passed", capsys.readouterr().out
    assert set(results.values()) == {"failed"}, capsys.readouterr().out
    assert capsys.readouterr().out.count("hint: ") == len(wrongs)
