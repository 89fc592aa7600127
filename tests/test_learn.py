"""The course harness (minialloc.learn): predictions compared fairly, exercises checked, nothing ever raises."""

from __future__ import annotations

from typing import Any

import pytest

from minialloc import GiB, MiB, learn


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
        ("20 MB", 20 * MiB, 0.0, "right"),  # ... MB read as MiB, the course's unit, with a note
        ("20 MB", 20_000_000, 0.0, "right"),  # ... and as MB where that is the answer
        ("21 MB", 20 * MiB, 0.0, "wrong"),
        ("1.4 GiB", int(1.44 * GiB), 0.01, "right"),  # the precision the text itself uses
        ("1,44 GiB", int(1.44 * GiB), 0.01, "right"),  # a decimal comma
        ("1 GiB", int(1.44 * GiB), 0.01, "wrong"),  # one significant digit is no answer
        ("1.4 GiB", int(1.44 * GiB), 0.0, "wrong"),  # an exact question wants the exact value
        ("20 MiB", int(19.5 * MiB), 0.01, "wrong"),  # 19.5 MiB is the misconception, never rounded into 20
        ("19.5 MiB", 20 * MiB, 0.01, "wrong"),
        ("100%", 1.0, 0.01, "right"),
        ("99.5 %", 1.0, 0.01, "right"),
        ("50%", 1.0, 0.01, "wrong"),
        ("6,526", 6526, 0.0, "right"),
        ("small pool", "small", 0.0, "right"),  # the words of the choices
        ("large pool", "small", 0.0, "wrong"),
        ("lower than the recorded run", "lower", 0.0, "right"),
        ("same", "the same", 0.0, "right"),
        ("not lower", "lower", 0.0, "wrong"),
        ("lower or higher", "lower", 0.0, "wrong"),
        ([1024, "small pool", "2 MiB"], (1024, "small", 2 * MiB), 0.0, "right"),
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


def test_mb_read_as_mib_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    learn.reveal("p", "20MB", 20 * MiB, "why")
    out = capsys.readouterr().out
    assert learn.results()["p"] == "right" and "read here as MiB" in out


def test_predicted_only_after_a_prediction() -> None:
    assert not learn.predicted("p")
    learn.reveal("p", ..., 3, "why")
    assert not learn.predicted("p")
    learn.reveal("p", 4, 3, "why")
    assert learn.predicted("p")
    learn.reveal("p", 3, 3, "why")
    assert learn.predicted("p")


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
    # a pending free does not keep its segment: empty_cache() synchronizes first
    return sum(s["total_size"] for s in snapshot["segments"]
               if all(b["state"] != "active_allocated" for b in s["blocks"]))


def _releasable_pending_pins(snapshot: dict) -> int:
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
        ("chapter2.check_releasable", _releasable_right, [_releasable_all_cached, _releasable_pending_pins]),
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


# --- the wrong answers that drew a misleading hint (issue 23), each with the hint it must get now -----------------
def _who_holds_from(states: tuple[str, ...], size: str = "size") -> Any:
    from minialloc.trace import top_user_frame

    def who_holds(snapshot: dict) -> dict:
        held: dict = {}
        for seg in snapshot["segments"]:
            for b in seg["blocks"]:
                if b["state"] in states:
                    held[top_user_frame(b["frames"])] = held.get(top_user_frame(b["frames"]), 0) + b[size]
        return held

    return who_holds


@pytest.mark.parametrize(
    ("states", "size", "says"),
    [
        (("active_allocated", "active_pending_free", "inactive"), "size", "free ones too"),  # "sum everything"
        (("active_allocated", "active_pending_free"), "size", "'active_pending_free' were freed"),
        (("active_allocated",), "requested_size", "not 'requested_size'"),
    ],
)
def test_who_holds_names_the_slip(states: tuple[str, ...], size: str, says: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    from minialloc.learn import chapter5

    first = learn.check("c5-who-holds", _who_holds_from(states, size), chapter5.check_who_holds)
    out = learn.check("c5-who-holds", _who_holds_from(states, size), chapter5.check_who_holds)  # the second rung
    assert learn.results()["c5-who-holds"] == "failed" and says in out and says not in first, out


def _pinned(live_states: tuple[str, ...], free_states: tuple[str, ...]) -> Any:
    def pinned_segments(snapshot: dict, min_free_fraction: float = 0.5) -> list[int]:
        return sorted(s["address"] for s in snapshot["segments"]
                      if any(b["state"] in live_states for b in s["blocks"])
                      and sum(b["size"] for b in s["blocks"] if b["state"] in free_states)
                      >= min_free_fraction * s["total_size"])

    return pinned_segments


def test_pinned_counts_only_live_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    from minialloc.learn import chapter5

    learn.check("right", _pinned(("active_allocated",), ("inactive", "active_pending_free")),
                chapter5.check_pinned_segments)
    for _ in range(2):  # the slip is named at the second miss, the rule at the first
        learn.check("pending_pins", _pinned(("active_allocated", "active_pending_free"), ("inactive",)),
                    chapter5.check_pinned_segments)
    out = capsys.readouterr().out
    assert learn.results() == {"right": "passed", "pending_pins": "failed"}, out
    assert "only a live block (active_allocated) pins a segment" in out


def test_releasable_names_the_pending_slip(capsys: pytest.CaptureFixture[str]) -> None:
    from minialloc.learn import chapter2

    learn.check("c2-releasable", _releasable_pending_pins, chapter2.check_releasable)
    out = capsys.readouterr().out
    assert "active_pending_free" in out and "rule 8" in out, out


def test_retry_ladder_gives_the_rule_before_the_order_of_calls(capsys: pytest.CaptureFixture[str]) -> None:
    from minialloc.learn import chapter1

    for _ in range(2):
        learn.check("c1-retry", _retry_releases_first, chapter1.check_get_segment)
    first, second = capsys.readouterr().out.split("[c1-retry]")[1:]
    assert "chapter 1, rule 4 (best fit per stream) and rule 7" in first
    assert "only if" not in first and "do it only" not in first  # the key step is not given at the first miss
    assert "chapter 1, rule 4" not in second


def test_build_oom_ladder(capsys: pytest.CaptureFixture[str]) -> None:
    from minialloc.learn import chapter2

    for _ in range(2):
        learn.check("c2-build-oom", _oom_all_live, chapter2.check_oom_trace)
    first, second = capsys.readouterr().out.split("[c2-build-oom]")[1:]
    assert "chapter 2, steps 1 and 2" in first and "pieces smaller than the request" not in first
    assert "chapter 2, steps 1 and 2" not in second


# --- every exercise's hint ladder: rule and failing case first, closer at each miss, the fix never first ----------


def _retry_ignores_the_cache(device: Any, cache: list, size: int) -> int:
    return device.malloc(size)


def _peak_without_reset(alloc: Any, step: Any) -> int:
    step(alloc)
    return alloc.max_memory_allocated()


def _releasable_every_free_byte(snapshot: dict) -> int:
    return sum(seg["total_size"] - seg["allocated_size"] for seg in snapshot["segments"])


def _oom_trace_that_fits() -> list:
    from minialloc.workloads import alloc

    return [alloc("a", 100 * MiB)]


def _pages_without_the_last(offset: int, size: int, page_size: int) -> range:
    return range(offset // page_size, (offset + size) // page_size)


def _cow_second_writer_copies_again() -> tuple:
    return {1: [0, 2], 2: [0, 3, 4]}, [(1, 2), (1, 3)]


def _sampling_copies_everything(prompt: int, samples: int, generated: int, block_size: int = 16) -> int:
    return samples * -(-(prompt + generated) // block_size)


def _who_holds_every_block(snapshot: dict) -> dict:
    from minialloc.trace import top_user_frame

    out: dict = {}
    for seg in snapshot["segments"]:
        for block in seg["blocks"]:
            key = top_user_frame(block.get("frames", []))
            out[key] = out.get(key, 0) + block["size"]
    return out


def _ladder_cases() -> list:
    from minialloc.learn import chapter1, chapter2, chapter3, chapter4, chapter5, chapter6

    return [
        ("c1-retry", _retry_ignores_the_cache, chapter1.check_get_segment),
        ("c1-step-peak", _peak_without_reset, chapter1.check_step_peak),
        ("c2-releasable", _releasable_every_free_byte, chapter2.check_releasable),
        ("c2-build-oom", _oom_trace_that_fits, chapter2.check_oom_trace),
        ("c3-pages-touched", _pages_without_the_last, chapter3.check_pages_touched),
        ("c3-unmap-pages", lambda blocks, page_size: [], chapter3.check_pages_to_unmap),
        ("c4-cow-by-hand", _cow_second_writer_copies_again, chapter4.check_cow_by_hand),
        ("c4-sampling-blocks", _sampling_copies_everything, chapter4.check_sampling_blocks),
        ("c5-who-holds", _who_holds_every_block, chapter5.check_who_holds),
        ("c5-pinned", _pinned(("active_allocated", "active_pending_free"), ("inactive",)),
         chapter5.check_pinned_segments),
        ("c6-fit-7b", lambda: {"micro_batch": 4}, chapter6.check_fit_7b),
        ("c6-choose-fix", lambda: dict.fromkeys("ABC", "expandable_segments:True"), chapter6.check_fixes),
    ]


EXERCISES = ("c1-retry", "c1-step-peak", "c2-releasable", "c2-build-oom", "c3-pages-touched", "c3-unmap-pages",
             "c4-cow-by-hand", "c4-sampling-blocks", "c5-who-holds", "c5-pinned", "c6-fit-7b", "c6-choose-fix")


def _hint_line(text: str) -> str:
    return next((ln for ln in text.splitlines() if ln.startswith("hint: ")), "")


@pytest.mark.parametrize("eid", EXERCISES)
def test_every_exercise_climbs_a_hint_ladder(eid: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A plausible wrong answer, checked three times in a row: the first miss names the failing case and only the
    rule to re-read; the second gives a hint the first did not show; the third is at least as close. So at least
    two rungs come before any fix."""
    _, wrong, checker = next(case for case in _ladder_cases() if case[0] == eid)
    texts = [learn.check(eid, wrong, checker) for _ in range(3)]
    capsys.readouterr()
    assert all(learn.results()[eid] == "failed" for _ in texts), texts
    first, second, third = (_hint_line(t) for t in texts)
    assert texts[0].splitlines()[0] == texts[1].splitlines()[0] == texts[2].splitlines()[0]  # the same failing case
    assert "chapter " in first and "(miss again" in first, texts[0]  # rung 1: the rule, by chapter
    assert second and second != first and second[len("hint: "):] not in texts[0], texts[:2]  # rung 2: closer
    assert third, texts[2]


def test_every_exercise_of_the_course_has_a_ladder_case() -> None:
    import json
    from pathlib import Path

    course = Path(__file__).resolve().parent.parent / "course"
    ids = {cell["metadata"]["minialloc"]["id"] for nb in sorted(course.glob("0[1-6]_*.ipynb"))
           for cell in json.loads(nb.read_text())["cells"] if "exercise" in cell["metadata"].get("tags", [])}
    assert ids == set(EXERCISES) == {case[0] for case in _ladder_cases()}


def test_a_fix_rung_comes_third(capsys: pytest.CaptureFixture[str]) -> None:
    from minialloc.learn import chapter1

    texts = [learn.check("c1-step-peak", _peak_without_reset, chapter1.check_step_peak) for _ in range(4)]
    assert "reset_peak_memory_stats()" not in texts[0] + texts[1]  # the fix never at the first or second miss
    assert "reset_peak_memory_stats()" in texts[2] and _hint_line(texts[2]) == _hint_line(texts[3])
