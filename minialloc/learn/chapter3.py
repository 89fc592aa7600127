"""Chapter 3 (expandable segments): which pages a request maps and which empty_cache() unmaps, measured on
minialloc, and the two page exercises' checkers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..allocator import CachingAllocator
from ..device import SimulatedGPU
from ..expandable import ExpandableSegment
from ..replay import replay
from ..sizes import MiB, format_size
from ..workloads import canonical_scenario
from . import Wrong, call, say

__all__ = ["TEXT", "WHY", "Block", "blocks_of", "check_pages_to_unmap", "check_pages_touched", "mapped_pages", "why"]

# Every sentence a learner reads from this chapter's checkers, in the course's three languages (minialloc.lang).
TEXT: dict[str, dict[str, str]] = {
    "not_pages": {"en": "your function returned {got}, a {type}", "vi": "hàm của bạn trả về {got}, kiểu {type}",
                  "de": "Ihre Funktion gab {got} zurück, vom Typ {type}"},
    "not_pages_hint": {"en": "return the page numbers as a list, a set or a range",
                       "vi": "hãy trả về các số trang dưới dạng list, set hoặc range",
                       "de": "geben Sie die Seitennummern als list, set oder range zurück"},
    "case": {"en": "a block of {size} at offset {offset} (pages of 20 MiB)",
             "vi": "một khối {size} ở vị trí (offset) {offset} (trang 20 MiB)",
             "de": "ein Block von {size} bei Offset {offset} (Seiten zu 20 MiB)"},
    "page_after": {"en": "{case}: you included the page after its end",
                   "vi": "{case}: bạn đã tính cả trang nằm sau điểm kết thúc của khối",
                   "de": "{case}: Sie haben die Seite nach seinem Ende mitgezählt"},
    "page_after_hint": {"en": "a block that ends exactly on a page boundary does not touch the next page",
                        "vi": "khối kết thúc đúng tại ranh giới trang thì không chạm vào trang kế tiếp",
                        "de": "ein Block, der genau auf einer Seitengrenze endet, berührt die nächste Seite nicht"},
    "last_page": {"en": "{case}: you left out the page its last bytes lie on",
                  "vi": "{case}: bạn đã bỏ sót trang chứa những byte cuối cùng của khối",
                  "de": "{case}: Sie haben die Seite ausgelassen, auf der seine letzten Bytes liegen"},
    "last_page_hint": {"en": "a block that ends inside a page needs that whole page mapped",
                       "vi": "khối kết thúc giữa một trang thì cần ánh xạ cả trang đó",
                       "de": "ein Block, der mitten in einer Seite endet, braucht diese ganze Seite gemappt"},
    "first_page": {"en": "{case}: you left out the page its first bytes lie on",
                   "vi": "{case}: bạn đã bỏ sót trang chứa những byte đầu tiên của khối",
                   "de": "{case}: Sie haben die Seite ausgelassen, auf der seine ersten Bytes liegen"},
    "first_page_hint": {"en": "the first page is the one the offset falls in: offset // page_size",
                        "vi": "trang đầu tiên là trang chứa offset: offset // page_size",
                        "de": "die erste Seite ist die, in die der Offset fällt: offset // page_size"},
    "pages_wrong": {"en": "{case}: you said pages {got}, which are not the pages it lies on",
                    "vi": "{case}: bạn nói các trang {got}, nhưng khối không nằm trên đúng những trang đó",
                    "de": "{case}: Sie nannten die Seiten {got}, auf denen er nicht liegt"},
    "pages_wrong_hint": {
        "en": "pages are numbered from 0 at the range's start; page i covers [i * page_size, (i + 1) * page_size)",
        "vi": "các trang được đánh số từ 0 tại đầu vùng địa chỉ; trang i phủ [i * page_size, (i + 1) * page_size)",
        "de": "die Seiten sind ab 0 am Anfang des Bereichs nummeriert; Seite i umfasst [i * page_size, "
              "(i + 1) * page_size)",
    },
    "touched_passed": {
        "en": "{n} blocks, at and next to page boundaries, agree with minialloc's ExpandableSegment",
        "vi": "{n} khối, nằm ngay tại và sát ranh giới trang, đều khớp với ExpandableSegment của minialloc",
        "de": "{n} Blöcke auf und neben Seitengrenzen stimmen mit minialloc's ExpandableSegment überein",
    },
    "state_story": {"en": "the story above (30 MiB freed before a live 15 MiB block)",
                    "vi": "câu chuyện ở trên (30 MiB được giải phóng, đứng trước một khối 15 MiB đang dùng)",
                    "de": "die Geschichte oben (30 MiB freigegeben vor einem belegten 15-MiB-Block)"},
    "state_canonical": {"en": "chapter 2's trace before the 2 GiB request",
                        "vi": "trace của chương 2, trước yêu cầu 2 GiB",
                        "de": "der Trace aus Kapitel 2 vor der Anforderung von 2 GiB"},
    "state_aligned": {"en": "free runs on page boundaries", "vi": "các dải trống nằm trên ranh giới trang",
                      "de": "freie Bereiche auf Seitengrenzen"},
    "state_all_free": {"en": "every block free", "vi": "mọi khối đều trống", "de": "alle Blöcke frei"},
    "unmap_extra": {"en": "state '{state}': you would unmap page(s) {pages}, which empty_cache() keeps",
                    "vi": "trạng thái '{state}': bạn sẽ bỏ ánh xạ (unmap) trang {pages}, nhưng empty_cache() giữ "
                          "lại chúng",
                    "de": "Zustand '{state}': Sie würden Seite(n) {pages} unmappen, die empty_cache() behält"},
    "unmap_half_hint": {
        "en": "a page is unmapped only when it lies WHOLLY inside a free block: one byte of a live block on it "
              "keeps it mapped",
        "vi": "một trang chỉ bị bỏ ánh xạ khi nó nằm TRỌN trong một khối trống: chỉ cần một byte của khối đang "
              "dùng nằm trên đó là trang vẫn được giữ ánh xạ",
        "de": "eine Seite wird nur dann unmappt, wenn sie VOLLSTÄNDIG in einem freien Block liegt: ein einziges "
              "Byte eines belegten Blocks auf ihr hält sie gemappt",
    },
    "unmap_unmapped_hint": {
        "en": "only mapped pages can be unmapped: stay within the blocks given",
        "vi": "chỉ những trang đang được ánh xạ mới bỏ ánh xạ được: hãy ở trong phạm vi các khối đã cho",
        "de": "nur gemappte Seiten lassen sich unmappen: bleiben Sie innerhalb der gegebenen Blöcke",
    },
    "unmap_missing": {
        "en": "state '{state}': empty_cache() also unmaps page(s) {pages}, which you left out",
        "vi": "trạng thái '{state}': empty_cache() còn bỏ ánh xạ cả trang {pages}, mà bạn đã bỏ sót",
        "de": "Zustand '{state}': empty_cache() unmappt auch Seite(n) {pages}, die Sie ausgelassen haben",
    },
    "unmap_missing_hint": {
        "en": "every page that lies wholly inside a free block goes, wherever it is: at the start, between live "
              "blocks, at the end; a page that starts or ends exactly on the free block's edge counts",
        "vi": "mọi trang nằm trọn trong một khối trống đều bị bỏ ánh xạ, dù ở đâu: ở đầu, giữa các khối đang "
              "dùng, ở cuối; trang bắt đầu hoặc kết thúc đúng tại mép của khối trống cũng được tính",
        "de": "jede Seite, die vollständig in einem freien Block liegt, fällt weg, wo auch immer: am Anfang, "
              "zwischen belegten Blöcken, am Ende; eine Seite, die genau am Rand des freien Blocks beginnt oder "
              "endet, zählt mit",
    },
    "unmap_passed": {
        "en": "{n} allocator states: the pages you named are the ones empty_cache() unmapped",
        "vi": "{n} trạng thái của bộ cấp phát: các trang bạn nêu đúng là những trang empty_cache() đã bỏ ánh xạ",
        "de": "{n} Zustände des Allokators: die von Ihnen genannten Seiten sind genau die, die empty_cache() "
              "unmappt hat",
    },
}

# Why each prediction of this chapter comes out as it does: shown by learn.reveal once the learner has
# predicted, never in the notebook's visible source (a Run All would show it under the blank cell).
WHY: dict[str, dict[str, str]] = {
    "c3-first-map": {
        "en": "30 MiB at offset 0 lies on page 0 (0-20 MiB) and on part of page 1 (20-40 MiB): a page is mapped "
              "whole, so {reserved} are reserved and the last 10 MiB are a free block, mapped and cached.",
        "vi": "30 MiB tại offset 0 nằm trên trang 0 (0-20 MiB) và một phần trang 1 (20-40 MiB): trang luôn được ánh "
              "xạ nguyên trang, nên {reserved} được dành riêng, và 10 MiB cuối là một khối trống, đã ánh xạ và nằm "
              "trong bộ nhớ đệm.",
        "de": "30 MiB ab Offset 0 liegen auf Seite 0 (0-20 MiB) und auf einem Teil von Seite 1 (20-40 MiB): Eine "
              "Seite wird immer ganz eingeblendet, also sind {reserved} reserviert, und die letzten 10 MiB sind ein "
              "freier Block, eingeblendet und im Cache.",
    },
    "c3-second-map": {
        "en": "the lowest room is right after the first block, at 30 MiB: 10 MiB are already mapped there (the end of"
              " page 1), and the block runs on to 45 MiB, into page 2, which gets mapped.",
        "vi": "chỗ trống thấp nhất nằm ngay sau khối đầu tiên, tại 30 MiB: ở đó đã có 10 MiB được ánh xạ (phần cuối "
              "của trang 1), và khối kéo dài tới 45 MiB, sang trang 2, nên trang 2 được ánh xạ.",
        "de": "der niedrigste freie Platz liegt direkt hinter dem ersten Block, bei 30 MiB: Dort sind schon 10 MiB "
              "eingeblendet (das Ende von Seite 1), und der Block reicht bis 45 MiB, also in Seite 2 hinein, die "
              "eingeblendet wird.",
    },
    "c3-unmap": {
        "en": "the free block is 0-30 MiB: page 0 lies wholly inside it and goes back to the device; page 1 (20-40 "
              "MiB) also holds the live 15 MiB block (30-45 MiB), so it stays, and so does page 2. The free 10 MiB "
              "left on page 1 stays mapped and cached. Reserved now: {reserved}.",
        "vi": "khối trống là 0-30 MiB: trang 0 nằm trọn trong đó nên được trả về thiết bị; trang 1 (20-40 MiB) còn "
              "chứa khối 15 MiB đang sống (30-45 MiB) nên được giữ lại, trang 2 cũng vậy. 10 MiB trống còn lại trên "
              "trang 1 vẫn được ánh xạ và nằm trong bộ nhớ đệm. Bộ nhớ dành riêng lúc này: {reserved}.",
        "de": "der freie Block reicht von 0 bis 30 MiB: Seite 0 liegt vollständig darin und geht an das Gerät zurück;"
              " auf Seite 1 (20-40 MiB) liegt auch der lebende 15-MiB-Block (30-45 MiB), also bleibt sie, ebenso "
              "Seite 2. Die freien 10 MiB, die auf Seite 1 übrig sind, bleiben eingeblendet und im Cache. Jetzt "
              "reserviert: {reserved}.",
    },
}


def why(pid: str, **fields: object) -> str:
    """The explanation of prediction ``pid`` in the notebook's language, with the measured ``fields`` filled in."""
    return say(WHY, pid, **fields)

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
            raise Wrong(say(TEXT, "first_page", case=case), say(TEXT, "first_page_hint"))
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
