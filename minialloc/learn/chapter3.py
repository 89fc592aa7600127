"""Chapter 3 (expandable segments): which pages a request maps and which empty_cache() unmaps, measured on
minialloc, and the two page exercises' checkers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..allocator import CachingAllocator
from ..device import SimulatedGPU
from ..expandable import ExpandableSegment
from ..lang import messages
from ..oom import OutOfMemoryError
from ..replay import replay
from ..sizes import MiB, format_size
from ..workloads import canonical_scenario
from . import Wrong, call, explainer, ladder, say

__all__ = ["TEXT", "WHY", "Block", "blocks_of", "check_pages_to_unmap", "check_pages_touched", "mapped_pages",
           "settings_figure", "why"]

# Every sentence a learner reads from this chapter's checkers, in English, shown in the notebook's language
# (minialloc.lang).
TEXT = messages("minialloc.learn.chapter3.TEXT", {
    "not_pages": "your function returned {got}, a {type}",
    "not_pages_hint": "return the page numbers as a list, a set or a range",
    "case": "a block of {size} at offset {offset} (pages of 20 MiB)",
    "page_after": "{case}: you included the page after its end",
    "page_after_hint": "a block that ends exactly on a page boundary does not touch the next page",
    "last_page": "{case}: you left out the page its last bytes lie on",
    "last_page_hint": "a block that ends inside a page needs that whole page mapped",
    "first_page": "{case}: you left out the page its first bytes lie on",
    "first_page_hint": "which page holds the block's first byte, the one at the offset itself?",
    "first_page_fix": "the first page is the one the offset falls in: offset // page_size",
    "pages_rule":
        "chapter 3, 'Which pages does a request map?': page i covers [i * page_size, (i + 1) * page_size), and a "
        "page is mapped whole",
    "unmap_rule":
        "chapter 3, the c3-unmap prediction: with expandable segments, release unmaps every page that lies "
        "wholly inside a free block, wherever it sits",
    "pages_wrong": "{case}: you said pages {got}, which are not the pages it lies on",
    "pages_wrong_hint":
        "pages are numbered from 0 at the range's start; page i covers [i * page_size, (i + 1) * page_size)",
    "touched_passed": "{n} blocks, at and next to page boundaries, agree with minialloc's ExpandableSegment",
    "state_story": "the story above (30 MiB freed before a live 15 MiB block)",
    "state_canonical": "chapter 2's trace before the 2 GiB request",
    "state_aligned": "free runs on page boundaries",
    "state_all_free": "every block free",
    "unmap_extra": "state '{state}': you would unmap page(s) {pages}, which empty_cache() keeps",
    "unmap_half_hint":
        "a page is unmapped only when it lies WHOLLY inside a free block: one byte of a live block on it "
        "keeps it mapped",
    "unmap_unmapped_hint": "only mapped pages can be unmapped: stay within the blocks given",
    "unmap_missing": "state '{state}': empty_cache() also unmaps page(s) {pages}, which you left out",
    "unmap_missing_hint":
        "every page that lies wholly inside a free block goes, wherever it is: at the start, between live "
        "blocks, at the end; a page that starts or ends exactly on the free block's edge counts",
    "unmap_passed": "{n} allocator states: the pages you named are the ones empty_cache() unmapped",
    "figure_failed": "OOM, fragmentation {fragmentation}",
})

# Why each prediction of this chapter comes out as it does: shown by learn.reveal once the learner has
# predicted, never in the notebook's visible source (a Run All would show it under the blank cell).
WHY = messages("minialloc.learn.chapter3.WHY", {
    "c3-first-map":
        "30 MiB at offset 0 lies on page 0 (0-20 MiB) and on part of page 1 (20-40 MiB): a page is mapped "
        "whole, so {reserved} are reserved and the last 10 MiB are a free block, mapped and cached.",
    "c3-second-map":
        "the lowest room is right after the first block, at 30 MiB: 10 MiB are already mapped there (the end of"
        " page 1), and the block runs on to 45 MiB, into page 2, which gets mapped.",
    "c3-unmap":
        "the free block is 0-30 MiB: page 0 lies wholly inside it and goes back to the device; page 1 (20-40 "
        "MiB) also holds the live 15 MiB block (30-45 MiB), so it stays, and so does page 2. The free 10 MiB "
        "left on page 1 stays mapped and cached. Reserved now: {reserved}.",
})


why = explainer(WHY)  # why(pid, **fields): prediction pid's explanation, in the notebook's language

Block = tuple[int, int, bool]  # (offset from the start of the reserved range, size, free?)


def _segment(alloc: CachingAllocator, page_size: int) -> ExpandableSegment:
    """The allocator's expandable segment with that page size (20 MiB: the large pool; 2 MiB: the small pool)."""
    for seg in alloc.expandable_segments:
        if seg.page_size == page_size:
            return seg
    raise LookupError(f"no expandable segment with {format_size(page_size)} pages")


def mapped_pages(alloc: CachingAllocator, page_size: int = 20 * MiB) -> set[int]:
    """Page numbers (from the start of the reserved range) that have physical memory mapped behind them."""
    try:
        seg = _segment(alloc, page_size)
    except LookupError:
        return set()
    return {i for i, handle in enumerate(seg.handles) if handle is not None}


def blocks_of(alloc: CachingAllocator, page_size: int = 20 * MiB) -> list[Block]:
    """The mapped blocks of one expandable segment, from a snapshot: (offset, size, free?), in address order."""
    seg = _segment(alloc, page_size)
    out = []
    for s in alloc.snapshot()["segments"]:
        for b in s["blocks"]:
            if seg.ptr <= b["address"] < seg.ptr + seg.size:
                out.append((b["address"] - seg.ptr, b["size"], b["state"] == "inactive"))
    return sorted(out)


# --- exercise c3-pages-touched -------------------------------------------------------------------------------


def _minialloc_pages(offset: int, size: int, page: int) -> set[int]:
    """Map a block's pages on a fresh expandable segment, as the allocator's map_block does, and read them."""
    gpu = SimulatedGPU(64 * page)
    seg = ExpandableSegment(gpu, 0, page)
    start = offset // page * page  # map_block maps from the page the block starts in
    seg.map(seg.ptr + start, offset + size - start)
    return {i for i, h in enumerate(seg.handles) if h is not None}


def _pages(result: Any) -> set[int]:
    if isinstance(result, (set, frozenset, list, tuple, range)):
        return set(result)
    raise Wrong(say(TEXT, "not_pages", got=repr(result), type=type(result).__name__), say(TEXT, "not_pages_hint"))


@ladder(TEXT, "pages_rule")
def check_pages_touched(pages_touched: Callable[[int, int, int], Iterable[int]]) -> str:
    """Exercise c3-pages-touched: pages_touched(offset, size, page_size) = the pages [offset, offset+size) lies on,
    checked at and next to every page boundary against minialloc's ExpandableSegment."""
    page = 20 * MiB
    cases = [(0, 512), (0, page), (0, page + 512), (page - 512, 512), (page - 512, 1024), (page, page),
             (30 * MiB, 15 * MiB), (3 * page + 512, 2 * page - 512), (5 * MiB, page - 5 * MiB), (0, 5 * page)]
    for offset, size in cases:
        got = _pages(call(pages_touched, offset, size, page))
        want = _minialloc_pages(offset, size, page)
        if got == want:
            continue
        case = say(TEXT, "case", size=format_size(size), offset=format_size(offset))
        if got == want | {max(want) + 1} and (offset + size) % page == 0:
            raise Wrong(say(TEXT, "page_after", case=case), say(TEXT, "page_after_hint"))
        if got == want - {max(want)}:
            raise Wrong(say(TEXT, "last_page", case=case), say(TEXT, "last_page_hint"))
        if got == want - {min(want)}:
            raise Wrong(say(TEXT, "first_page", case=case), say(TEXT, "first_page_hint"),
                        fix=say(TEXT, "first_page_fix"))
        raise Wrong(say(TEXT, "pages_wrong", case=case, got=sorted(got)), say(TEXT, "pages_wrong_hint"))
    return say(TEXT, "touched_passed", n=len(cases))


# --- exercise c3-unmap ---------------------------------------------------------------------------------------


def _state_story(a: CachingAllocator) -> None:
    p = a.malloc(30 * MiB)
    a.malloc(15 * MiB)
    a.free(p)


def _state_canonical(a: CachingAllocator) -> None:
    replay(canonical_scenario()[:-1], a)


def _state_aligned(a: CachingAllocator) -> None:
    # free runs that start and end exactly on page boundaries, and one that covers no whole page
    ptrs = [a.malloc(n) for n in (20 * MiB, 40 * MiB, 20 * MiB, 10 * MiB, 25 * MiB, 20 * MiB)]
    for i in (1, 3, 4):
        a.free(ptrs[i])


def _state_all_free(a: CachingAllocator) -> None:
    ptrs = [a.malloc(n) for n in (50 * MiB, 70 * MiB)]
    for p in ptrs:
        a.free(p)


_UNMAP_STATES: list[tuple[str, Callable[[CachingAllocator], None]]] = [
    ("state_story", _state_story),  # (message id of the state's name, builder)
    ("state_canonical", _state_canonical),
    ("state_aligned", _state_aligned),
    ("state_all_free", _state_all_free),
]


@ladder(TEXT, "unmap_rule")
def check_pages_to_unmap(pages_to_unmap: Callable[[list[Block], int], Iterable[int]]) -> str:
    """Exercise c3-unmap: pages_to_unmap(blocks, page_size) = the pages empty_cache() unmaps, compared with what
    empty_cache() does to the allocator's mappings."""
    page = 20 * MiB
    for what_id, build in _UNMAP_STATES:
        what = say(TEXT, what_id)
        a = CachingAllocator(SimulatedGPU("8GiB"), "expandable_segments:True")
        build(a)
        blocks = blocks_of(a, page)
        got = _pages(call(pages_to_unmap, list(blocks), page))
        before = mapped_pages(a, page)
        a.empty_cache()
        want = before - mapped_pages(a, page)
        if got == want:
            continue
        extra, missing = sorted(got - want), sorted(want - got)
        if extra:
            half = [i for i in extra if i in before]
            hint = say(TEXT, "unmap_half_hint" if half else "unmap_unmapped_hint")
            raise Wrong(say(TEXT, "unmap_extra", state=what, pages=extra), hint)
        raise Wrong(say(TEXT, "unmap_missing", state=what, pages=missing), say(TEXT, "unmap_missing_hint"))
    return say(TEXT, "unmap_passed", n=len(_UNMAP_STATES))


# --- the older knobs' table: one figure per workload and setting ----------------------------------------------


def settings_figure(events: list, capacity: int | str, config: str) -> str:
    """The table's figure for one replay. A run that completes: peak allocated / peak reserved (1.0: nothing
    held beyond the peak of live memory). A run that fails has no peak worth comparing (it stopped early, with its
    reserved memory unusable), so its figure is the fragmentation at the first failure, 1 - largest free block /
    total free, as the OOM message's minialloc line reports it (TensorFlow's BFC allocator and RMM's arena report
    the same ratio)."""
    result = replay(events, CachingAllocator(SimulatedGPU(capacity), config))
    if not result.ooms:
        return f"{result.peak_allocated / result.peak_reserved:.3f}"
    at_failure = CachingAllocator(SimulatedGPU(capacity), config)
    replay(events[:result.first_failure], at_failure)
    try:
        at_failure.malloc(events[result.first_failure].size)
    except OutOfMemoryError as e:
        return say(TEXT, "figure_failed", fragmentation=f"{e.report.fragmentation:.2f}")
    raise AssertionError("the replay failed at this event, so the same malloc from the same state must fail")
