"""The memory budget: bytes per parameter, activations by the published formula, what each fix changes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from minialloc import GiB, MiB
from minialloc.budget import LLAMA_7B, Model, Training, estimate, plot_budget

TINY = Model("tiny", params=1000, layers=2, hidden=8, heads=2, vocab=10)


def test_mixed_precision_adam_is_16_bytes_per_parameter():
    b = estimate(TINY, workspace=0, cuda_context=0)
    assert b.items["weights"] == 2000 and b.items["gradients"] == 2000
    assert b.items["optimizer states"] == 12000  # fp32 master + two fp32 moments
    pure = estimate(TINY, master_weights=False, adam_state_bytes=2)
    assert pure.items["optimizer states"] == 4000  # two bf16 moments, no master copy


def test_activations_follow_korthikanti_formula():
    s, b, h, a, L, v = 16, 3, TINY.hidden, TINY.heads, TINY.layers, TINY.vocab
    flash = estimate(TINY, seq_len=s, micro_batch=b).items["activations"]
    assert flash == L * 34 * s * b * h + 4 * s * b * v
    scores = estimate(TINY, seq_len=s, micro_batch=b, flash_attention=False).items["activations"]
    assert scores - flash == L * 5 * a * s * s * b  # the attention score matrices
    ckpt = estimate(TINY, seq_len=s, micro_batch=b, checkpointing=True).items["activations"]
    assert ckpt == L * 2 * s * b * h + 34 * s * b * h + 4 * s * b * v


def test_activations_scale_with_the_micro_batch_and_nothing_else_does():
    one, four = estimate(LLAMA_7B, micro_batch=1), estimate(LLAMA_7B, micro_batch=4)
    assert four.items["activations"] == 4 * one.items["activations"]
    assert all(four.items[k] == one.items[k] for k in one.items if k != "activations")


def test_7b_with_adam_on_80_gib():
    base = estimate(LLAMA_7B)
    assert base.items["weights"] + base.items["gradients"] + base.items["optimizer states"] == 16 * LLAMA_7B.params
    assert not base.fits(80 * GiB)  # 100 GiB of model state alone
    assert not estimate(LLAMA_7B, checkpointing=True).fits(80 * GiB)  # activations are not the problem
    offloaded = estimate(LLAMA_7B, offload_optimizer=True)
    assert offloaded.items["optimizer states"] == 0 and offloaded.fits(80 * GiB)
    assert estimate(LLAMA_7B, master_weights=False, adam_state_bytes=2).fits(80 * GiB)
    # a micro-batch of 4 full sequences needs checkpointing even with the optimizer offloaded
    assert not estimate(LLAMA_7B, offload_optimizer=True, micro_batch=4).fits(80 * GiB)
    assert estimate(LLAMA_7B, offload_optimizer=True, micro_batch=4, checkpointing=True).fits(80 * GiB)


def test_assumed_items_are_parameters():
    b = estimate(TINY, workspace=3 * MiB, cuda_context=5 * MiB)
    assert b.items["workspaces"] == 3 * MiB and b.items["CUDA context"] == 5 * MiB
    assert b.total == sum(b.items.values())


def test_training_object_and_changes_combine():
    t = Training(micro_batch=2, checkpointing=True)
    assert estimate(TINY, t, micro_batch=3).training == Training(micro_batch=3, checkpointing=True)


@pytest.mark.parametrize("bad", [dict(micro_batch=0), dict(seq_len=0), dict(adam_state_bytes=3), dict(weight_bytes=8)])
def test_bad_settings_raise(bad):
    with pytest.raises(ValueError):
        estimate(TINY, **bad)


def test_table_names_every_item_and_the_verdict():
    text = estimate(LLAMA_7B).table(80 * GiB)
    for name in ("weights", "gradients", "optimizer states", "activations", "workspaces", "CUDA context", "total"):
        assert name in text
    assert "does NOT fit in 80.00 GiB" in text
    assert "fits in 80.00 GiB" in estimate(LLAMA_7B, offload_optimizer=True).table(80 * GiB)


def test_plot_draws_one_bar_per_budget_and_the_capacity_line():
    budgets = [("as is", estimate(LLAMA_7B)), ("offload", estimate(LLAMA_7B, offload_optimizer=True))]
    ax = plot_budget(budgets, 80 * GiB, title="t")
    assert len(ax.patches) == 2 * 6  # six items stacked per bar
    assert any(abs(line.get_xdata()[0] - 80) < 1e-9 for line in ax.get_lines())
    assert [t.get_text() for t in ax.get_yticklabels()] == ["as is", "offload"]
    matplotlib.pyplot.close(ax.figure)


def test_the_budget_speaks_the_notebooks_language():
    import string

    from minialloc import lang
    from minialloc.budget import ITEM_NAMES, TEXT

    for table in (ITEM_NAMES, TEXT):
        for key, texts in table.items():
            assert set(texts) == set(lang.LANGS) and all(texts.values()), key
            fields = {f for _, f, _, _ in string.Formatter().parse(texts["en"]) if f}
            assert all({f for _, f, _, _ in string.Formatter().parse(t) if f} == fields for t in texts.values()), key
    b = estimate(LLAMA_7B)
    english = b.table(80 * GiB)
    with lang.using("de"):
        german = b.table(80 * GiB)
    assert "weights" in english and "does NOT fit" in english
    assert "Gewichte" in german and "gesamt" in german and "passt NICHT" in german and "weights" not in german
    assert [line.split()[-2] for line in english.splitlines()[1:-1]] == \
        [line.split()[-2] for line in german.splitlines()[1:-1]]  # the same figures, row by row
