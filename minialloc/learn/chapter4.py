"""Chapter 4 (paging for the KV cache): the opening picture and the exercise checkers.

The hidden references live here, not in the notebook: a learner who opens this file reads the answers, which is
fine for a self-learner and no secret worth guarding; the notebook itself gives none away. Every check runs the
real block manager (minialloc.paging.BlockManager) and compares the learner's answer with what it did.
"""

from __future__ import annotations

import numbers
import random
from collections.abc import Callable
from typing import Any

from ..lang import messages
from ..paging import BlockManager
from . import NotYet, Wrong, call, expect, explainer, ladder, say

__all__ = ["COW_SCENARIO", "TEXT", "WHY", "check_cow_by_hand", "check_sampling_blocks", "opening_figure",
           "run_cow_scenario", "run_sampling", "why"]

# Every sentence a learner reads from this chapter (its picture's title, the checkers' feedback), in English, shown
# in the notebook's language (minialloc.lang).
TEXT = messages("minialloc.learn.chapter4.TEXT", {
    "opening_title":
        "Two samples of one prompt: a block table per sequence, blocks anywhere in the pool, the full block "
        "shared",
    "copies_list": "the copies must be a list of (source, destination) pairs, got {type}",
    "copies_list_hint": "write [] if you think nothing is copied",
    "copy_pair": "each copy is a (source, destination) pair, got {item}",
    "copy_pair_hint": "a copy names the shared block it reads and the new block it writes",
    "two_things": "return two things: the tables (a dict) and the copies (a list)",
    "two_things_hint": "end with `return tables, copies`",
    "tables_dict": "the tables must be a dict with the keys 1 and 2 (the two sequences), got {got}",
    "tables_dict_hint": "one entry per sequence: {{1: [...], 2: [...]}}",
    "still_blank": "a table or the copies are still ...",
    "table_list": "sequence {seq}'s table must be a list of physical block numbers, got {got}",
    "table_list_hint": "a block table lists one physical block number per logical block: [logical 0's block, ...]",
    "table_length":
        "sequence {seq} ends with {n} logical blocks in your table; its token count needs a different number",
    "table_length_hint": "count the tokens of the sequence at the end, then divide by 4 tokens per block, rounding up",
    "fork_hint": "a fork copies nothing: the child starts with exactly the parent's table",
    "append_hint":
        "at each append ask: is the last block full (take the lowest free block) or shared (ref count > 1: "
        "copy it to the lowest free block) or neither (write in place)? A block that the other sequence has "
        "already copied away from is no longer shared",
    "wrong_block":
        "sequence {seq}, logical block {i}: your table says physical block {block}, which is not where the "
        "block manager put it",
    "copy_count": "your tables are right, but you list {n} copies; the block manager made a different number",
    "copy_count_hint": "a copy happens only when a write hits a block whose ref count is above 1",
    "copy_wrong": "your tables are right, but a copy's source or destination is not",
    "copy_wrong_hint":
        "the source is the shared block before the write, the destination the block the writer's table names "
        "afterwards",
    "cow_passed": "tables {tables}, copies {copies}, as the block manager made them",
    "not_int": "blocks_after_sampling({args}) returned {got}, not an int",
    "not_int_hint": "a number of blocks is a whole number: use // and the ceiling trick -(-a // b)",
    "no_writes_hint": "before anyone writes, nothing has been copied: what do the samples share right after a fork?",
    "full_prompt_hint":
        "when the prompt fills its last block exactly, every prompt block is full: does the first generated "
        "token go into one of them, or into a new block? Is anything copied?",
    "partial_hint":
        "full prompt blocks stay shared; the partly filled one is copied by every writer but the last, which "
        "finds it no longer shared; count each sample's blocks from there on",
    "more": "more",
    "fewer": "fewer",
    "sampling_wrong":
        "blocks_after_sampling(prompt={prompt}, samples={samples}, generated={generated}, block_size={bs}) "
        "returned {got}; the block manager ends with {more} blocks in use",
    "sampling_passed": "{n} cases agree with the block manager, boundaries included",
    "cow_rule": "chapter 4, 'Sharing: fork and copy-on-write': what a fork copies, and which write makes a copy",
})

# Why each prediction of this chapter comes out as it does: shown by learn.reveal once the learner has
# predicted, never in the notebook's visible source (a Run All would show it under the blank cell).
WHY = messages("minialloc.learn.chapter4.WHY", {
    "c4-grow":
        "9 tokens need 3 blocks of 4 (9 / 4, rounded up). A block is taken only when the last one is full: the "
        "prompt took 2, and the 9th token opened the 3rd. The other 5 stay free for other sequences; this "
        "sequence wastes 3 slots of its last block, never more than one block's worth.",
    "c4-cow-used":
        "the fork copied nothing: both tables named the same 3 blocks, each with reference count 2. Sequence "
        "2's token went into the shared, partly filled last block, so that one block was copied first (3 + 1 = "
        "4 in use); the two full blocks stay shared.",
    "c4-prefix-hit":
        "the system prompt fills two full blocks, cached under chained hashes, so request 11 reuses both (8 "
        "tokens). Each request's last block holds its own tokens and is its own: 3 blocks for request 10, 1 new"
        " one for request 11, 4 in all.",
})


why = explainer(WHY)  # why(pid, **fields): prediction pid's explanation, in the notebook's language


def opening_figure() -> Any:
    """The chapter's picture: two samples of one prompt after a fork and one write each (copy-on-write)."""
    from ..viz.block_table import plot_block_table

    m = BlockManager(num_blocks=8, block_size=4)
    m.allocate(1, [11, 12, 13, 14, 15, 16])
    m.fork(1, 2)
    m.append_token(2, 99)
    return plot_block_table(m, title=say(TEXT, "opening_title"))


# --- exercise c4-cow-by-hand: fill two block tables for a fork with copy-on-write ---------------------------------

# The scenario the notebook describes in words, step by step. A fresh manager hands out its free blocks lowest
# number first, which is what makes the tables predictable by hand.
COW_SCENARIO: list[tuple[str, int, Any]] = [
    ("allocate", 1, [1, 2, 3, 4, 5, 6]),
    ("fork", 1, 2),
    ("append", 1, 7),
    ("append", 1, 8),
    ("append", 2, 70),
    ("append", 2, 80),
    ("append", 2, 90),
]


def run_cow_scenario() -> tuple[dict[int, list[int]], list[tuple[int, int]]]:
    """Run COW_SCENARIO on a BlockManager(num_blocks=8, block_size=4): (tables by sequence, copies in order)."""
    m = BlockManager(num_blocks=8, block_size=4)
    for op, seq, arg in COW_SCENARIO:
        if op == "allocate":
            m.allocate(seq, arg)
        elif op == "fork":
            m.fork(seq, arg)
        else:
            m.append_token(seq, arg)
    return {sid: list(m.seq(sid).table) for sid in (1, 2)}, m.take_copies()


def _as_pairs(copies: Any) -> list[tuple[int, int]]:
    expect(isinstance(copies, (list, tuple)), say(TEXT, "copies_list", type=type(copies).__name__),
           say(TEXT, "copies_list_hint"))
    pairs = []
    for c in copies:
        expect(isinstance(c, (list, tuple)) and len(c) == 2, say(TEXT, "copy_pair", item=repr(c)),
               say(TEXT, "copy_pair_hint"))
        pairs.append((c[0], c[1]))
    return pairs


@ladder(TEXT, "cow_rule")
def check_cow_by_hand(fn: Callable[[], Any]) -> str:
    """fn() returns ({1: table, 2: table}, [(src, dst), ...]) for COW_SCENARIO, filled in by hand."""
    answer = call(fn)
    expect(isinstance(answer, tuple) and len(answer) == 2, say(TEXT, "two_things"), say(TEXT, "two_things_hint"))
    tables, copies = answer
    expect(isinstance(tables, dict) and set(tables) == {1, 2}, say(TEXT, "tables_dict", got=repr(tables)),
           say(TEXT, "tables_dict_hint"))
    if any(t is Ellipsis for t in tables.values()) or copies is Ellipsis:
        raise NotYet(say(TEXT, "still_blank"))
    right_tables, right_copies = run_cow_scenario()
    pairs = _as_pairs(copies)
    for sid in (1, 2):
        table = tables[sid]
        expect(isinstance(table, (list, tuple)) and all(isinstance(b, numbers.Integral) and not isinstance(b, bool)
                                                        for b in table),
               say(TEXT, "table_list", seq=sid, got=repr(table)), say(TEXT, "table_list_hint"))
        mine, real = [int(b) for b in table], right_tables[sid]
        if len(mine) != len(real):
            raise Wrong(say(TEXT, "table_length", seq=sid, n=len(mine)), say(TEXT, "table_length_hint"),
                        rule=say(TEXT, "cow_rule"))
        for i, (a, b) in enumerate(zip(mine, real, strict=True)):
            if a != b:
                hint = say(TEXT, "fork_hint" if i == 0 else "append_hint")
                raise Wrong(say(TEXT, "wrong_block", seq=sid, i=i, block=a), hint, rule=say(TEXT, "cow_rule"))
    if len(pairs) != len(right_copies):
        raise Wrong(say(TEXT, "copy_count", n=len(pairs)), say(TEXT, "copy_count_hint"), rule=say(TEXT, "cow_rule"))
    expect(pairs == right_copies, say(TEXT, "copy_wrong"), say(TEXT, "copy_wrong_hint"), rule=say(TEXT, "cow_rule"))
    return say(TEXT, "cow_passed", tables=right_tables, copies=right_copies)


# --- exercise c4-sampling-blocks: physical blocks after parallel sampling ------------------------------------------


def run_sampling(prompt: int, samples: int, generated: int, block_size: int = 16) -> int:
    """Physical blocks in use after `samples` parallel samples of a `prompt`-token prompt each generated
    `generated` tokens, measured on the block manager (fork, then decode step by step)."""
    needed = samples * (-(-(prompt + generated) // block_size)) + 1
    m = BlockManager(num_blocks=needed, block_size=block_size, enable_prefix_caching=False)
    m.allocate(0, list(range(prompt)))
    for s in range(1, samples):
        m.fork(0, s)
    for step in range(generated):  # one decoding step appends a token to every sample
        for s in range(samples):
            m.append_token(s, 10_000 + step)
    return needed - m.num_free_blocks


def _sampling_cases(seed: int = 4) -> list[tuple[int, int, int, int]]:
    """Boundaries first (prompt a multiple of the block size, nothing generated, one sample), then random ones."""
    cases = [(20, 3, 5, 16), (32, 2, 1, 16), (32, 3, 0, 16), (20, 3, 0, 16), (7, 1, 30, 16), (16, 4, 16, 16),
             (5, 2, 3, 4), (1, 5, 1, 4)]
    rng = random.Random(seed)
    for _ in range(30):
        bs = rng.choice((4, 8, 16))
        cases.append((rng.randint(1, 70), rng.randint(1, 6), rng.randint(0, 40), bs))
    return cases


@ladder(TEXT, "cow_rule")
def check_sampling_blocks(fn: Callable[..., Any]) -> str:
    """fn(prompt, samples, generated, block_size) -> physical blocks in use, checked against the block manager."""
    cases = _sampling_cases()
    for prompt, samples, generated, bs in cases:
        got = call(fn, prompt, samples, generated, bs)
        # an int or any whole-number type (numpy's int64 too); a float, even 4.0, is not a count of blocks
        expect(isinstance(got, numbers.Integral) and not isinstance(got, bool),
               say(TEXT, "not_int", args=f"{prompt}, {samples}, {generated}, {bs}", got=repr(got)),
               say(TEXT, "not_int_hint"))
        got = int(got)
        real = run_sampling(prompt, samples, generated, bs)
        if got != real:
            more = say(TEXT, "more" if real > got else "fewer")
            if generated == 0:
                hint = say(TEXT, "no_writes_hint")
            elif prompt % bs == 0:
                hint = say(TEXT, "full_prompt_hint")
            else:
                hint = say(TEXT, "partial_hint")
            raise Wrong(say(TEXT, "sampling_wrong", prompt=prompt, samples=samples, generated=generated, bs=bs,
                            got=got, more=more), hint, rule=say(TEXT, "cow_rule"))
    return say(TEXT, "sampling_passed", n=len(cases))
