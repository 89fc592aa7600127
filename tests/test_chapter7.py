"""Chapter 7's machinery, fast: PyTorch 2.13's message with every clause and its reader, the decision rule on each
kind of evidence, and each exercise's hint ladder (the rule at the first miss, the crux at the second, never the
fix). The chapter itself runs in tests/test_capstone.py."""

from __future__ import annotations

import random

import pytest

from minialloc import CachingAllocator, MiB, OutOfMemoryError, SimulatedGPU, learn
from minialloc.learn import chapter7


def test_the_message_is_the_allocators_own_when_it_has_no_extra_clause() -> None:
    a = CachingAllocator(SimulatedGPU("400MiB"), "")
    with pytest.raises(OutOfMemoryError) as caught:
        chapter7._fragmenting_step(a)
    report = caught.value.report
    evidence = chapter7.Evidence(tried=report.alloc_size, total=report.total_capacity, free=report.device_free,
                                 allocated=report.allocated, reserved=report.reserved)
    assert evidence.message() == report.pytorch_message()


def printed(n: int) -> int:
    """A byte count as the message prints it (two decimals in PyTorch's unit), read back."""
    from minialloc.sizes import pytorch_format_size

    number, unit = pytorch_format_size(n).split()
    return chapter7._bytes(number, unit)


def test_every_clause_is_read_back_and_each_kind_is_decided_as_drawn() -> None:
    rng = random.Random(3)
    for kind in (*chapter7.HOLDERS, "container"):
        for _ in range(50):
            e = chapter7.random_evidence(rng, kind)
            for text in (e.message(), chapter7.wrapped(e.message(), 80)):
                f = chapter7.read_oom(text)
                assert f["tried"] == printed(e.tried) and f["gpu"] == e.gpu
                assert f["private_pools"] == (printed(e.private) if e.private else 0)
                assert f["allowed"] == (None if e.allowed is None else printed(e.allowed))
                assert (f["this_process"] is None) == all(pid is not None for pid, _ in e.processes)
                assert len(f["other_processes"]) == sum(pid is not None for pid, _ in e.processes)
            holder, fix = chapter7.decide(chapter7.read_oom(e.message()))
            assert holder == ("live tensors" if kind == "container" else kind)
            assert fix == chapter7.FIXES[holder]


def test_the_private_pool_clause_is_pytorchs() -> None:
    text = chapter7.exhibit("graphs").message()
    assert "is allocated by PyTorch, with 12.20 GiB allocated in private pools (e.g., CUDA Graphs), and " in text
    printed = chapter7.exhibit("graphs").allocated + chapter7.exhibit("graphs").private  # X counts V: two decimals
    assert abs(chapter7.read_oom(text)["allocated"] - printed) <= 0.005 * 1024**3


def test_a_message_without_its_sentences_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="not a CUDA out-of-memory message"):
        chapter7.read_oom("RuntimeError: CUDA error: an illegal memory access was encountered")


def _ladder(eid: str, wrong: object, checker, fix_words: tuple[str, ...]) -> None:
    """Two misses in a row: the rule, then the crux; neither holds the fix."""
    learn.reset()
    first, second = learn.check(eid, wrong, checker), learn.check(eid, wrong, checker)
    assert "not passed" in first and "miss again" in first and "miss again" not in second, (first, second)
    assert first.splitlines()[-1] != second.splitlines()[-1]
    for word in fix_words:
        assert word not in first and word not in second, (word, first, second)


def test_every_exercise_has_two_rungs_before_the_fix(english_by_default) -> None:
    def forgets_private(message):
        fields = chapter7.read_oom(message)
        return {**fields, "private_pools": 0}

    _ladder("c7-read", forgets_private, chapter7.check_read_oom, ("re.search", "round("))

    def swallows(step, alloc, path):
        from minialloc import dump_snapshot

        alloc.record_memory_history()
        try:
            return step(alloc)
        except OutOfMemoryError:
            dump_snapshot(alloc, path)

    _ladder("c7-capture", swallows, chapter7.check_capture, ("raise\n", "`raise`"))
    _ladder("c7-replay-fix", "garbage_collection_threshold:0.8", chapter7.check_replay_fix,
            ("expandable_segments", "max_split_size_mb"))


def test_the_real_run_fails_on_8_gib_and_its_fix_is_measured_by_replay() -> None:
    result, message = chapter7.real_failure()
    assert result.failed and chapter7.decide(chapter7.read_oom(message))[0] == "cached blocks"
    assert chapter7.empty_cache_rescues() is False
    fixed, _ = chapter7.replay_real("expandable_segments:True")
    assert not fixed.failed and fixed.peak_reserved < chapter7.REAL_CAPACITY
    share, pools = chapter7.private_share()
    assert 0.99 < share < 1 and (0, 0) in pools and MiB <= pools[(0, 0)]
