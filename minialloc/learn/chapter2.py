"""Chapter 2 (fragmentation): the exercise checkers, each measuring the learner's answer on minialloc.

Exercise c2-build-oom: build your own OOM. Given a GPU and a request, write a trace after which the request fails
while at least a given amount of memory is free. Exercise c2-releasable: from a snapshot, compute how much
empty_cache() would give back, checked against what empty_cache() really gives back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..allocator import CachingAllocator
from ..device import SimulatedGPU
from ..oom import OutOfMemoryError
from ..replay import TraceError, replay
from ..sizes import GiB, KiB, MiB, format_size
from ..workloads import Event, canonical_scenario
from . import NotYet, Wrong, call, expect, say

__all__ = ["OOM_CAPACITY", "OOM_MIN_FREE", "OOM_REQUEST", "TEXT", "WHY", "check_oom_trace", "check_releasable", "why"]

# Every sentence a learner reads from this chapter's checkers, in the course's three languages (minialloc.lang).
TEXT: dict[str, dict[str, str]] = {
    "not_list": {"en": "my_oom_trace() returned a {type}, not a list of events",
                 "vi": "my_oom_trace() trả về một {type}, không phải danh sách sự kiện",
                 "de": "my_oom_trace() gab ein {type} zurück, keine Liste von Ereignissen"},
    "not_list_hint": {"en": "return a list such as [alloc('a', 600 * MiB), free('a'), ...]",
                      "vi": "hãy trả về một danh sách như [alloc('a', 600 * MiB), free('a'), ...]",
                      "de": "geben Sie eine Liste wie [alloc('a', 600 * MiB), free('a'), ...] zurück"},
    "empty": {"en": "your trace is empty", "vi": "trace của bạn đang rỗng", "de": "Ihr Trace ist leer"},
    "not_event": {"en": "item {i} of your trace, {item}, is not an event",
                  "vi": "phần tử {i} trong trace của bạn, {item}, không phải một sự kiện",
                  "de": "Element {i} Ihres Traces, {item}, ist kein Ereignis"},
    "not_event_hint": {"en": "build events with alloc(name, size) and free(name)",
                       "vi": "hãy tạo sự kiện bằng alloc(name, size) và free(name)",
                       "de": "bauen Sie Ereignisse mit alloc(name, size) und free(name)"},
    "names_hint": {"en": "give every live tensor its own name; free only names that are allocated",
                   "vi": "hãy đặt cho mỗi tensor đang dùng một tên riêng; chỉ free những tên đang được cấp phát",
                   "de": "geben Sie jedem belegten Tensor einen eigenen Namen; geben Sie nur Namen frei, die "
                         "angelegt sind"},
    "trace_oom": {
        "en": "your trace itself ran out of memory at event {i} ({op} {name}, {size})",
        "vi": "chính trace của bạn đã hết bộ nhớ ở sự kiện {i} ({op} {name}, {size})",
        "de": "schon Ihr Trace selbst lief bei Ereignis {i} in Speichermangel ({op} {name}, {size})",
    },
    "trace_oom_hint": {
        "en": "at no point may more than {capacity} be live at once; free tensors on the way",
        "vi": "không lúc nào được dùng cùng lúc quá {capacity}; hãy free bớt tensor trên đường đi",
        "de": "zu keinem Zeitpunkt dürfen mehr als {capacity} gleichzeitig belegt sein; geben Sie unterwegs "
              "Tensoren frei",
    },
    "succeeded": {"en": "after your trace, the {size} request succeeded",
                  "vi": "sau trace của bạn, yêu cầu {size} vẫn thành công",
                  "de": "nach Ihrem Trace war die Anforderung von {size} erfolgreich"},
    "succeeded_hint": {
        "en": "a request fails only when no cached block fits it, the device cannot give a new segment, and "
              "release and retry (rule 7) frees too little: every cached segment must hold a live block, and "
              "the device's own free memory must be too small",
        "vi": "một yêu cầu chỉ thất bại khi không khối nào trong bộ nhớ đệm vừa với nó, thiết bị không cấp được "
              "phân đoạn mới, và bước giải phóng rồi thử lại (quy tắc 7) giải phóng quá ít: mỗi phân đoạn trong "
              "bộ nhớ đệm phải còn giữ một khối đang dùng, và bộ nhớ trống của chính thiết bị phải quá nhỏ",
        "de": "eine Anforderung scheitert nur, wenn kein Block im Cache passt, das Gerät kein neues Segment "
              "hergeben kann und Freigeben und Wiederholen (Regel 7) zu wenig freimacht: jedes Segment im Cache "
              "muss einen belegten Block enthalten, und der freie Speicher des Geräts selbst muss zu klein sein",
    },
    "too_little_free": {
        "en": "it failed, but only {free} was free: with that little free it is a plain out-of-memory, not "
              "fragmentation",
        "vi": "yêu cầu có thất bại, nhưng chỉ còn {free} trống: trống ít như vậy thì đơn giản là hết bộ nhớ, không "
              "phải phân mảnh",
        "de": "sie scheiterte, aber nur {free} waren frei: bei so wenig freiem Speicher ist das schlichter "
              "Speichermangel, keine Fragmentierung",
    },
    "too_little_free_hint": {
        "en": "keep at least {min_free} free, in pieces smaller than the request: free pieces in segments pinned "
              "by a live block",
        "vi": "hãy giữ ít nhất {min_free} trống, thành những mảnh nhỏ hơn yêu cầu: các mảnh trống nằm trong "
              "những phân đoạn bị một khối đang dùng giữ chặt",
        "de": "halten Sie mindestens {min_free} frei, in Stücken kleiner als die Anforderung: freie Stücke in "
              "Segmenten, die ein belegter Block festhält",
    },
    "oom_passed": {
        "en": "{request} failed with {free} free in all; the largest free block was {largest} (fragmentation "
              "{fragmentation})",
        "vi": "yêu cầu {request} thất bại dù tổng cộng còn {free} trống; khối trống lớn nhất là {largest} (độ "
              "phân mảnh {fragmentation})",
        "de": "{request} scheiterte bei insgesamt {free} freiem Speicher; der größte freie Block war {largest} "
              "(Fragmentierung {fragmentation})",
    },
    "state_step1": {"en": "chapter 2 after step 1", "vi": "chương 2 sau bước 1", "de": "Kapitel 2 nach Schritt 1"},
    "state_step2": {"en": "chapter 2 after step 2", "vi": "chương 2 sau bước 2", "de": "Kapitel 2 nach Schritt 2"},
    "state_mixed": {"en": "a mix of whole free, pinned and live segments",
                    "vi": "lẫn lộn phân đoạn trống hoàn toàn, phân đoạn bị giữ chặt và phân đoạn đang dùng",
                    "de": "eine Mischung aus ganz freien, festgehaltenen und belegten Segmenten"},
    "state_small": {"en": "many small tensors", "vi": "nhiều tensor nhỏ", "de": "viele kleine Tensoren"},
    "state_pending": {"en": "a block freed while another stream may still read it",
                      "vi": "một khối đã giải phóng trong khi một luồng CUDA khác có thể vẫn đang đọc nó",
                      "de": "ein Block, freigegeben, während ein anderer Stream ihn vielleicht noch liest"},
    "pending_kept": {
        "en": "state '{state}': you kept a segment whose only used block is 'active_pending_free'; empty_cache() "
              "gave back {actual}",
        "vi": "trạng thái '{state}': bạn giữ lại một phân đoạn mà khối duy nhất còn dùng ở trạng thái "
              "'active_pending_free'; empty_cache() trả lại {actual}",
        "de": "Zustand '{state}': Sie haben ein Segment behalten, dessen einziger benutzter Block "
              "'active_pending_free' ist; empty_cache() gab {actual} zurück",
    },
    "pending_kept_hint": {
        "en": "chapter 1, rule 8 (streams), and the block states above: what does empty_cache() do first about "
              "work still queued on other streams?",
        "vi": "chương 1, quy tắc 8 (luồng CUDA), và các trạng thái khối ở trên: empty_cache() làm gì trước tiên "
              "với công việc còn xếp hàng trên các luồng CUDA khác?",
        "de": "Kapitel 1, Regel 8 (Streams), und die Blockzustände oben: Was tut empty_cache() zuerst mit Arbeit, "
              "die noch in anderen Streams wartet?",
    },
    "not_int": {"en": "releasable returned {got}, a {type}", "vi": "releasable trả về {got}, kiểu {type}",
                "de": "releasable gab {got} zurück, vom Typ {type}"},
    "not_int_hint": {"en": "return a number of bytes, an int", "vi": "hãy trả về số byte, kiểu int",
                     "de": "geben Sie eine Anzahl Bytes zurück, ein int"},
    "all_cached": {
        "en": "state '{state}': you counted every cached free byte, {got}, but empty_cache() gave back {actual}",
        "vi": "trạng thái '{state}': bạn đã đếm mọi byte trống trong bộ nhớ đệm, {got}, nhưng empty_cache() chỉ "
              "trả lại {actual}",
        "de": "Zustand '{state}': Sie haben jedes freie Byte im Cache gezählt, {got}, aber empty_cache() gab "
              "{actual} zurück",
    },
    "all_cached_hint": {
        "en": "a free piece inside a segment that still holds a live block cannot go back: only segments whose "
              "blocks are all free can",
        "vi": "một mảnh trống nằm trong phân đoạn vẫn còn giữ khối đang dùng thì không trả lại được: chỉ những "
              "phân đoạn mà mọi khối đều trống mới trả lại được",
        "de": "ein freies Stück in einem Segment, das noch einen belegten Block enthält, kann nicht zurück: nur "
              "Segmente, deren Blöcke alle frei sind",
    },
    "releasable_wrong": {
        "en": "state '{state}': you said {got}, empty_cache() gave back {actual}",
        "vi": "trạng thái '{state}': bạn nói {got}, empty_cache() trả lại {actual}",
        "de": "Zustand '{state}': Sie sagten {got}, empty_cache() gab {actual} zurück",
    },
    "releasable_wrong_hint": {
        "en": "look at each segment's blocks: a segment goes back to the device whole (its total_size), and only "
              "when none of its blocks is allocated",
        "vi": "hãy xem các khối của từng phân đoạn: một phân đoạn được trả về thiết bị nguyên vẹn (total_size của "
              "nó), và chỉ khi không khối nào của nó đang được cấp phát",
        "de": "sehen Sie sich die Blöcke jedes Segments an: ein Segment geht als Ganzes (seine total_size) an das "
              "Gerät zurück, und nur, wenn keiner seiner Blöcke belegt ist",
    },
    "oom_rule": {
        "en": "chapter 2, steps 1 and 2: how big freed segments, reused by smaller tensors, left free memory that no "
              "single request could use",
        "vi": "chương 2, bước 1 và 2: các phân đoạn lớn đã giải phóng, khi được tensor nhỏ hơn dùng lại, để lại bộ "
              "nhớ trống mà không yêu cầu đơn lẻ nào dùng được như thế nào",
        "de": "Kapitel 2, Schritte 1 und 2: wie große freigegebene Segmente, von kleineren Tensoren wiederverwendet, "
              "freien Speicher hinterließen, den keine einzelne Anforderung nutzen konnte",
    },
}

# Why each prediction of this chapter comes out as it does: shown by learn.reveal once the learner has
# predicted, never in the notebook's visible source (a Run All would show it under the blank cell).
WHY: dict[str, dict[str, str]] = {
    "c2-step1": {
        "en": "allocated {allocated}, reserved {reserved}, device free {device_free}. Freed tensors leave their "
              "blocks in the cache: the eight 840 MiB segments stay reserved, ready for the next step, and only a "
              "malloc that needs room (rule 7) or empty_cache() gives them back.",
        "vi": "bộ nhớ được cấp phát (allocated) {allocated}, dành riêng (reserved) {reserved}, thiết bị còn trống "
              "{device_free}. Tensor đã giải phóng để lại khối của chúng trong bộ nhớ đệm: tám phân đoạn 840 MiB vẫn "
              "được dành riêng, sẵn sàng cho bước sau, và chỉ một lần malloc cần chỗ (quy tắc 7) hoặc empty_cache() "
              "mới trả chúng về.",
        "de": "zugewiesen {allocated}, reserviert {reserved}, frei auf dem Gerät {device_free}. Freigegebene Tensoren"
              " lassen ihre Blöcke im Cache: Die acht Segmente zu 840 MiB bleiben reserviert, bereit für den nächsten"
              " Schritt, und nur ein malloc, das Platz braucht (Regel 7), oder empty_cache() gibt sie zurück.",
    },
    "c2-largest-free": {
        "en": "the largest cached free block is one 415 MiB piece, but the device still has 1.44 GiB free, and a new "
              "segment of that size could be had: the larger of the two is the biggest request that could succeed. "
              "Neither is 2 GiB.",
        "vi": "khối trống lớn nhất trong bộ nhớ đệm là một mảnh 415 MiB, nhưng thiết bị vẫn còn trống 1.44 GiB, và có"
              " thể xin được một phân đoạn mới cỡ đó: giá trị lớn hơn trong hai giá trị này là yêu cầu lớn nhất có "
              "thể thành công. Không giá trị nào đạt 2 GiB.",
        "de": "der größte freie Block im Cache ist ein Stück von 415 MiB, aber das Gerät hat noch 1,44 GiB frei, und "
              "ein neues Segment dieser Größe wäre zu haben: Das größere von beiden ist die größte Anforderung, die "
              "gelingen könnte. Keines erreicht 2 GiB.",
    },
    "c2-empty-cache": {
        "en": "every segment holds a live 425 MiB activation, so none is wholly free; and the failed malloc's release"
              " and retry had already released whatever was.",
        "vi": "phân đoạn nào cũng chứa một activation 425 MiB đang sống, nên không phân đoạn nào trống hoàn toàn; và "
              "bước giải phóng rồi thử lại của lần malloc thất bại đã giải phóng hết những gì có thể.",
        "de": "jedes Segment hält eine lebende Aktivierung von 425 MiB, also ist keines ganz frei; und was ganz frei "
              "war, hatte das fehlgeschlagene malloc beim Freigeben und erneuten Versuchen schon zurückgegeben.",
    },
    "c2-smaller-batch": {
        "en": "with 319 MiB activations, two of them share one old 840 MiB segment, so half the segments end up "
              "holding nothing; release and retry gives those back and the 2 GiB segment fits. Read on for how.",
        "vi": "với activation 319 MiB, hai activation dùng chung một phân đoạn 840 MiB cũ, nên một nửa số phân đoạn "
              "cuối cùng chẳng chứa gì; bước giải phóng rồi thử lại trả các phân đoạn đó về, và phân đoạn 2 GiB vừa "
              "chỗ. Đọc tiếp để biết vì sao.",
        "de": "mit Aktivierungen von 319 MiB teilen sich je zwei ein altes 840-MiB-Segment, also hält am Ende die "
              "Hälfte der Segmente gar nichts mehr; Freigeben und erneut versuchen gibt sie zurück, und das "
              "2-GiB-Segment passt. Wie genau, steht im nächsten Abschnitt.",
    },
}


def why(pid: str, **fields: object) -> str:
    """The explanation of prediction ``pid`` in the notebook's language, with the measured ``fields`` filled in."""
    return say(WHY, pid, **fields)

OOM_CAPACITY = 4 * GiB  # the GPU of the build-your-own-OOM exercise
OOM_REQUEST = 1 * GiB  # the request that must fail after the learner's trace
OOM_MIN_FREE = 2 * GiB  # ... while at least this much is free (device free + cached free blocks)


def _as_events(trace: Any) -> list[Event]:
    if not isinstance(trace, (list, tuple)):
        raise Wrong(say(TEXT, "not_list", type=type(trace).__name__), say(TEXT, "not_list_hint"))
    if not trace:
        raise NotYet(say(TEXT, "empty"))
    events = []
    for i, e in enumerate(trace):
        if isinstance(e, Event):
            events.append(e)
        elif isinstance(e, tuple) and e and e[0] in ("alloc", "free", "empty_cache"):
            events.append(Event(*e))
        else:
            raise Wrong(say(TEXT, "not_event", i=i, item=repr(e)), say(TEXT, "not_event_hint"))
    return events


def check_oom_trace(my_oom_trace: Callable[[], Sequence[Any]]) -> str:
    """Exercise c2-build-oom: after my_oom_trace()'s events on a fresh OOM_CAPACITY GPU (which must all succeed),
    malloc(OOM_REQUEST) fails while at least OOM_MIN_FREE is free."""
    events = _as_events(call(my_oom_trace))
    a = CachingAllocator(SimulatedGPU(OOM_CAPACITY), "")
    try:
        result = replay(events, a, source="your trace")
    except TraceError as exc:
        raise Wrong(str(exc), say(TEXT, "names_hint")) from None
    if result.ooms:
        e = events[result.first_failure or 0]
        raise Wrong(say(TEXT, "trace_oom", i=result.first_failure, op=e.op, name=repr(e.name),
                        size=format_size(e.size)),
                    say(TEXT, "trace_oom_hint", capacity=format_size(OOM_CAPACITY)))
    try:
        a.malloc(OOM_REQUEST)
    except OutOfMemoryError as exc:
        r = exc.report
    else:
        raise Wrong(say(TEXT, "succeeded", size=format_size(OOM_REQUEST)), say(TEXT, "succeeded_hint"),
                    rule=say(TEXT, "oom_rule"))
    expect(r.total_free >= OOM_MIN_FREE, say(TEXT, "too_little_free", free=format_size(r.total_free)),
           say(TEXT, "too_little_free_hint", min_free=format_size(OOM_MIN_FREE)), rule=say(TEXT, "oom_rule"))
    return say(TEXT, "oom_passed", request=format_size(OOM_REQUEST), free=format_size(r.total_free),
               largest=format_size(r.largest_free_block), fragmentation=f"{r.fragmentation:.2f}")


# --- exercise c2-releasable -------------------------------------------------------------------------------------


def _state_canonical_step1(a: CachingAllocator) -> None:
    replay(canonical_scenario()[:16], a)


def _state_canonical_step2(a: CachingAllocator) -> None:
    replay(canonical_scenario()[:-1], a)


def _state_mixed(a: CachingAllocator) -> None:
    # a whole free large segment, a wholly live one, one pinned by a live block, a pinned small segment and a
    # whole free small one: 100 MiB + 2 MiB come back
    big, live, pinned, tiny = a.malloc(100 * MiB), a.malloc(60 * MiB), a.malloc(3 * MiB), a.malloc(512)
    first = a.malloc(MiB)  # fits the first small segment's rest
    second = a.malloc(MiB)  # does not (512 bytes short): a second 2 MiB small segment
    a.free(second)
    a.free(big)
    del live, pinned, tiny, first  # they stay allocated


def _state_small_pool(a: CachingAllocator) -> None:
    # 600 tensors of 4 KiB fill one 2 MiB segment (512 of them) and start a second; freeing all of the second's
    # empties it, while the first stays pinned by its remaining live tensors
    ptrs = [a.malloc(4 * KiB) for _ in range(600)]
    for p in ptrs[512:]:
        a.free(p)
    for p in ptrs[:10]:
        a.free(p)


def _state_pending(a: CachingAllocator) -> None:
    # a 3 MiB tensor alone in a 20 MiB segment of stream 2, read by stream 1 and freed before stream 1 is done:
    # its block is active_pending_free. empty_cache() synchronizes first (PyTorch's release_cached_blocks starts
    # with synchronize_and_free_events), so the segment goes back; only active_allocated blocks keep a segment.
    p = a.malloc(3 * MiB, stream=2)
    a.device.launch(1)
    a.record_stream(p, 1)
    a.free(p)
    a.malloc(30 * MiB)  # and one live segment beside it


_STATES: list[tuple[str, str, Callable[[CachingAllocator], None]]] = [
    ("state_step1", "8GiB", _state_canonical_step1),  # (message id of the state's name, capacity, builder)
    ("state_step2", "8GiB", _state_canonical_step2),
    ("state_mixed", "8GiB", _state_mixed),
    ("state_small", "8GiB", _state_small_pool),
    ("state_pending", "8GiB", _state_pending),
]


def _releasable_counting_pending_as_live(snapshot: dict) -> int:
    """The usual slip: only segments whose blocks are all 'inactive' counted, as if a pending free kept its
    segment."""
    return sum(seg["total_size"] for seg in snapshot["segments"]
               if all(b["state"] == "inactive" for b in seg["blocks"]))


def check_releasable(releasable: Callable[[dict], int]) -> str:
    """Exercise c2-releasable: releasable(snapshot) must equal the reserved memory empty_cache() gives back."""
    lines = []
    for what_id, capacity, build in _STATES:
        what = say(TEXT, what_id)
        a = CachingAllocator(SimulatedGPU(capacity), "")
        build(a)
        snap = a.snapshot()
        got = call(releasable, snap)
        before = a.memory_reserved()
        a.empty_cache()
        actual = before - a.memory_reserved()
        expect(isinstance(got, int) and not isinstance(got, bool),
               say(TEXT, "not_int", got=repr(got), type=type(got).__name__), say(TEXT, "not_int_hint"))
        if got != actual:
            cached = before - a.memory_allocated()
            if got == _releasable_counting_pending_as_live(snap) and got != actual:
                raise Wrong(say(TEXT, "pending_kept", state=what, actual=format_size(actual)),
                            say(TEXT, "pending_kept_hint"))
            if got == cached and cached != actual:
                raise Wrong(say(TEXT, "all_cached", state=what, got=format_size(got), actual=format_size(actual)),
                            say(TEXT, "all_cached_hint"))
            raise Wrong(say(TEXT, "releasable_wrong", state=what, got=format_size(got), actual=format_size(actual)),
                        say(TEXT, "releasable_wrong_hint"))
        lines.append(f"{what}: {format_size(actual)}")
    return "; ".join(lines)
