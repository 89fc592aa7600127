"""Chapters 4 and 6's exercise checkers: the reference passes, blanks are "not yet", plausible wrong answers fail
with a message and a hint that do not give the answer away."""

from __future__ import annotations

import pytest

from minialloc import learn
from minialloc.learn import chapter4, chapter6


@pytest.fixture(autouse=True)
def _fresh_results():
    learn.reset()
    yield
    learn.reset()


def outcome(eid: str, obj, checker) -> tuple[str, str]:
    text = learn.check(eid, obj, checker)
    return learn.results()[eid], text


def blank():
    raise NotImplementedError  # your code here


# --- chapter 4 --------------------------------------------------------------------------------------------------


def test_cow_scenario_is_what_the_notebook_describes():
    tables, copies = chapter4.run_cow_scenario()
    assert tables == {1: [0, 2], 2: [0, 1, 3]} and copies == [(1, 2)]


@pytest.mark.parametrize("answer, says", [
    # the classic slip: the second writer copies too, although the first writer already left the block
    (({1: [0, 2], 2: [0, 3, 4]}, [(1, 2), (1, 3)]), "sequence 2, logical block 1"),
    # the fork copied everything
    (({1: [2, 3], 2: [0, 1, 4]}, [(1, 3)]), "sequence 1, logical block 0"),
    # right tables, a copy too many
    (({1: [0, 2], 2: [0, 1, 3]}, [(1, 2), (1, 3)]), "copies"),
    # right tables, source and destination swapped
    (({1: [0, 2], 2: [0, 1, 3]}, [(2, 1)]), "source or destination"),
    # too few blocks for 9 tokens
    (({1: [0, 2], 2: [0, 1]}, [(1, 2)]), "logical blocks"),
])
def test_cow_by_hand_rejects_wrong_tables(answer, says):
    status, text = outcome("c4-cow-by-hand", lambda: answer, chapter4.check_cow_by_hand)
    assert status == "failed" and says in text and "hint:" in text
    assert "[0, 1, 3]" not in text  # the right table is never printed


def test_cow_by_hand_blank_and_right():
    assert outcome("c4-cow-by-hand", blank, chapter4.check_cow_by_hand)[0] == "not yet"
    half = lambda: ({1: ..., 2: ...}, ...)  # noqa: E731  (the template's placeholders, returned)
    assert outcome("c4-cow-by-hand", half, chapter4.check_cow_by_hand)[0] == "not yet"
    right = lambda: ({1: [0, 2], 2: [0, 1, 3]}, [(1, 2)])  # noqa: E731
    assert outcome("c4-cow-by-hand", right, chapter4.check_cow_by_hand)[0] == "passed"


def _sampling_reference(prompt: int, samples: int, generated: int, block_size: int = 16) -> int:
    if generated == 0:
        return -(-prompt // block_size)
    full = prompt // block_size
    return full + samples * (-(-(prompt + generated) // block_size) - full)


def test_sampling_blocks_reference_passes_and_agrees_with_the_block_manager():
    assert outcome("c4-sampling-blocks", _sampling_reference, chapter4.check_sampling_blocks)[0] == "passed"
    assert chapter4.run_sampling(20, 3, 5) == 4  # 1 shared full block + 3 samples x 1 own block


@pytest.mark.parametrize("wrong", [
    # forgets that nothing is copied before the first write
    lambda p, s, g, bs=16: p // bs + s * (-(-(p + g) // bs) - p // bs),
    # counts the prompt's blocks once per sample (no sharing)
    lambda p, s, g, bs=16: s * -(-(p + g) // bs),
    # shares the partly filled block too
    lambda p, s, g, bs=16: -(-p // bs) + s * (-(-(p + g) // bs) - -(-p // bs)),
])
def test_sampling_blocks_rejects_plausible_wrong_formulas(wrong):
    status, text = outcome("c4-sampling-blocks", wrong, chapter4.check_sampling_blocks)
    assert status == "failed" and "hint:" in text


# --- chapter 6 --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("plan", [
    {"micro_batch": 4, "checkpointing": True, "offload_optimizer": True},
    {"micro_batch": 4, "checkpointing": True, "master_weights": False, "adam_state_bytes": 2},
])
def test_fit_7b_accepts_plans_that_fit(plan):
    assert outcome("c6-fit-7b", lambda: plan, chapter6.check_fit_7b)[0] == "passed"


@pytest.mark.parametrize("plan, says", [
    ({"micro_batch": 4, "offload_optimizer": True}, "over the 72 GiB"),  # activations of 4 sequences
    ({"micro_batch": 4, "checkpointing": True}, "largest item is optimizer states"),
    ({"micro_batch": 1, "offload_optimizer": True}, "at least 4"),  # fits, but not the team's batch
    ({"micro_batch": 4, "cuda_context": 0, "offload_optimizer": True, "checkpointing": True}, "cannot be changed"),
    ({"micro_batch": 4, "adam_state_bytes": 3}, "refused"),
])
def test_fit_7b_rejects_plans_that_do_not(plan, says):
    status, text = outcome("c6-fit-7b", lambda: plan, chapter6.check_fit_7b)
    assert status == "failed" and says in text


def test_each_failure_fails_as_described_and_only_the_right_kind_of_fix_saves_it():
    assert not chapter6.try_fix("A", "")[0] and not chapter6.try_fix("B", "")[0] and not chapter6.try_fix("C", "")[0]
    assert chapter6.try_fix("A", "expandable_segments:True")[0]
    assert chapter6.try_fix("A", "max_split_size_mb:128")[0]  # the older knob also saves this trace
    for conf in ("expandable_segments:True", "max_split_size_mb:128", "garbage_collection_threshold:0.6"):
        assert not chapter6.try_fix("B", conf)[0], conf  # live memory is too big: no setting helps
        assert not chapter6.try_fix("C", conf)[0], conf  # the other job's cache is the problem
    assert chapter6.try_fix("B", "smaller batch")[0] and chapter6.try_fix("B", "checkpointing")[0]
    assert chapter6.try_fix("C", "empty_cache")[0]


def test_choose_fix_checker():
    right = {"A": "expandable_segments:True", "B": "smaller batch", "C": "empty_cache"}
    assert outcome("c6-choose-fix", lambda: right, chapter6.check_fixes)[0] == "passed"
    assert outcome("c6-choose-fix", blank, chapter6.check_fixes)[0] == "not yet"
    assert outcome("c6-choose-fix", lambda: {"A": ..., "B": ..., "C": ...}, chapter6.check_fixes)[0] == "not yet"
    everything_expandable = dict.fromkeys("ABC", "expandable_segments:True")
    status, text = outcome("c6-choose-fix", lambda: everything_expandable, chapter6.check_fixes)
    assert status == "failed" and "failure B" in text and "hint:" in text
    batch_for_a = {**right, "A": "smaller batch"}  # the story of A fixes the batch
    status, text = outcome("c6-choose-fix", lambda: batch_for_a, chapter6.check_fixes)
    assert status == "failed" and "does not allow" in text
    loose = {"A": "expandable_segments:True", "B": " Smaller  Batch", "C": "empty_cache()"}  # as people type them
    assert outcome("c6-choose-fix", lambda: loose, chapter6.check_fixes)[0] == "passed"
    typo = {**right, "A": "expandable_segment:True"}
    status, text = outcome("c6-choose-fix", lambda: typo, chapter6.check_fixes)
    assert status == "failed" and "cannot use the setting" in text


def test_opening_figures_draw():
    import matplotlib

    matplotlib.use("Agg")
    assert chapter4.opening_figure().axes
    assert chapter6.opening_figure().axes


# --- review regressions: types people write, and names they use ---------------------------------------------------


def test_cow_by_hand_says_a_table_is_a_list():
    status, text = outcome("c4-cow-by-hand", lambda: ({1: 3, 2: [0, 1, 3]}, [(1, 2)]), chapter4.check_cow_by_hand)
    assert status == "failed" and "list of physical block numbers" in text and "your code raised" not in text


def test_sampling_blocks_accepts_numpy_integers_but_not_floats():
    import numpy as np

    as_numpy = lambda p, s, g, bs=16: np.int64(_sampling_reference(p, s, g, bs))  # noqa: E731
    assert outcome("c4-sampling-blocks", as_numpy, chapter4.check_sampling_blocks)[0] == "passed"
    as_float = lambda p, s, g, bs=16: float(_sampling_reference(p, s, g, bs))  # noqa: E731
    status, text = outcome("c4-sampling-blocks", as_float, chapter4.check_sampling_blocks)
    assert status == "failed" and "not an int" in text


@pytest.mark.parametrize("plan, says", [
    ({"micro_batch": 4, "checkpointing": True, "offload_optimizer": "no"}, "True or False"),  # "no" is truthy
    ({"micro_batch": 4.0, "checkpointing": True, "offload_optimizer": True}, "whole number"),
])
def test_fit_7b_rejects_values_of_the_wrong_type(plan, says):
    status, text = outcome("c6-fit-7b", lambda: plan, chapter6.check_fit_7b)
    assert status == "failed" and says in text


def test_choose_fix_accepts_common_names_and_explains_unknown_ones():
    named = {"A": "expandable_segments:True", "B": "gradient checkpointing", "C": "torch.cuda.empty_cache()"}
    assert outcome("c6-choose-fix", lambda: named, chapter6.check_fixes)[0] == "passed"
    vague = {"A": "defragment", "B": "smaller batch", "C": "empty_cache"}
    status, text = outcome("c6-choose-fix", lambda: vague, chapter6.check_fixes)
    assert status == "failed" and "neither an allocator setting" in text and "Accepted keys" not in text


def test_choose_fix_hints_do_not_name_the_settings():
    for hints in chapter6._HINTS.values():  # each hint in every language
        for hint in hints.values():
            assert "expandable" not in hint and "max_split" not in hint and "empty_cache" not in hint


# --- hint ladders: the first miss points to the rule, a second miss in a row gives the crux (issue 23) ----------
def _two_misses(eid: str, obj, checker) -> tuple[str, str]:
    first = outcome(eid, obj, checker)
    second = outcome(eid, obj, checker)
    assert first[0] == second[0] == "failed"  # the same verdict for the same answer
    return first[1], second[1]


def test_cow_by_hand_ladder():
    # the classic slip of the second writer copying again
    answer = ({1: [0, 2], 2: [0, 3, 4]}, [(1, 2), (1, 3)])
    first, second = _two_misses("c4-cow-by-hand", lambda: answer, chapter4.check_cow_by_hand)
    assert "chapter 4, 'Sharing: fork and copy-on-write'" in first
    assert "lowest free block" not in first and "ref count" not in first  # the key step waits for the 2nd miss
    assert "ref count" in second


def test_sampling_blocks_ladder():
    def every_sample_copies_everything(prompt: int, samples: int, generated: int, block_size: int = 16) -> int:
        return samples * -(-(prompt + generated) // block_size)

    first, second = _two_misses("c4-sampling-blocks", every_sample_copies_everything, chapter4.check_sampling_blocks)
    assert "chapter 4, 'Sharing" in first
    assert "stay shared" not in first and "copied by every writer" not in first and "is anything copied" not in first
    assert "chapter 4, 'Sharing" not in second


def test_choose_fix_ladder():
    everything_expandable = dict.fromkeys("ABC", "expandable_segments:True")
    first, second = _two_misses("c6-choose-fix", lambda: everything_expandable, chapter6.check_fixes)
    assert "chapter 6, 'When each fix wins'" in first and "no allocator setting" not in first
    assert "no allocator setting can help" in second


def test_a_pass_or_a_blank_restarts_the_ladder():
    everything_expandable = dict.fromkeys("ABC", "expandable_segments:True")
    outcome("c6-choose-fix", lambda: everything_expandable, chapter6.check_fixes)
    outcome("c6-choose-fix", blank, chapter6.check_fixes)
    status, text = outcome("c6-choose-fix", lambda: everything_expandable, chapter6.check_fixes)
    assert status == "failed" and "chapter 6, 'When each fix wins'" in text


def test_a_setting_that_rounds_every_tensor_up_is_no_fix():
    """roundup_power2_divisions:2 makes failure A's replay pass by rounding each tensor up until the whole card is
    allocated: the check says so instead of passing it; the settings that reuse or return pieces still pass."""
    fixes = {"A": "roundup_power2_divisions:2", "B": "checkpointing", "C": "empty_cache"}
    status, text = outcome("c6-choose-fix", lambda: fixes, chapter6.check_fixes)
    assert status == "failed" and "rounded up" in text and "8.00 GiB allocated" in text, text
    for setting in ("expandable_segments:True", "max_split_size_mb:128"):
        status, text = outcome("c6-choose-fix", lambda s=setting: {**fixes, "A": s}, chapter6.check_fixes)
        assert status == "passed", text
