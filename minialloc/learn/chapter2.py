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
from ..lang import messages
from ..oom import OutOfMemoryError
from ..replay import TraceError, replay
from ..sizes import GiB, KiB, MiB, format_size
from ..workloads import Event, canonical_scenario
from . import NotYet, Wrong, call, expect, explainer, ladder, say

__all__ = ["OOM_CAPACITY", "OOM_MIN_FREE", "OOM_REQUEST", "TEXT", "WHY", "check_oom_trace", "check_releasable", "why"]

# Every sentence a learner reads from this chapter's checkers, in English, shown in the notebook's language
# (minialloc.lang).
TEXT = messages("minialloc.learn.chapter2.TEXT", {
    "not_list": "my_oom_trace() returned a {type}, not a list of events",
    "not_list_hint": "return a list such as [alloc('a', 600 * MiB), free('a'), ...]",
    "empty": "your trace is empty",
    "not_event": "item {i} of your trace, {item}, is not an event",
    "not_event_hint": "build events with alloc(name, size) and free(name)",
    "names_hint": "give every live tensor its own name; free only names that are allocated",
    "trace_oom": "your trace itself ran out of memory at event {i} ({op} {name}, {size})",
    "trace_oom_hint": "at no point may more than {capacity} be live at once; free tensors on the way",
    "succeeded": "after your trace, the {size} request succeeded",
    "succeeded_hint":
        "a request fails only when no cached block fits it, the device cannot give a new segment, and "
        "release and retry (rule 7) frees too little: every cached segment must hold a live block, and "
        "the device's own free memory must be too small",
    "too_little_free":
        "it failed, but only {free} was free: with that little free it is a plain out-of-memory, not "
        "fragmentation",
    "too_little_free_hint":
        "keep at least {min_free} free, in pieces smaller than the request: free pieces in segments pinned "
        "by a live block",
    "oom_passed":
        "{request} failed with {free} free in all; the largest free block was {largest} (fragmentation "
        "{fragmentation})",
    "state_step1": "chapter 2 after step 1",
    "state_step2": "chapter 2 after step 2",
    "state_mixed": "a mix of whole free, pinned and live segments",
    "state_small": "many small tensors",
    "state_pending": "a block freed while another stream may still read it",
    "pending_kept":
        "state '{state}': you kept a segment whose only used block is 'active_pending_free'; empty_cache() "
        "gave back {actual}",
    "pending_kept_hint":
        "chapter 1, rule 8 (streams), and the block states above: what does empty_cache() do first about "
        "work still queued on other streams?",
    "not_int": "releasable returned {got}, a {type}",
    "not_int_hint": "return a number of bytes, an int",
    "all_cached": "state '{state}': you counted every cached free byte, {got}, but empty_cache() gave back {actual}",
    "all_cached_hint":
        "a free piece inside a segment that still holds a live block cannot go back: only segments whose "
        "blocks are all free can",
    "releasable_wrong": "state '{state}': you said {got}, empty_cache() gave back {actual}",
    "releasable_wrong_hint":
        "look at each segment's blocks: what decides whether empty_cache() can give that segment back, and how "
        "much of it goes when it does?",
    "releasable_wrong_fix":
        "a segment goes back to the device whole (its total_size), and only when none of its blocks is "
        "allocated",
    "releasable_rule":
        "chapter 2, 'Why empty_cache() does not help' (rule 6: a segment goes back only whole) and chapter 1, "
        "rule 8 (a block freed while another stream may still read it)",
    "oom_rule":
        "chapter 2, steps 1 and 2: how big freed segments, reused by smaller tensors, left free memory that no "
        "single request could use",
})

# Why each prediction of this chapter comes out as it does: shown by learn.reveal once the learner has
# predicted, never in the notebook's visible source (a Run All would show it under the blank cell).
WHY = messages("minialloc.learn.chapter2.WHY", {
    "c2-step1":
        "allocated {allocated}, reserved {reserved}, device free {device_free}. Freed tensors leave their "
        "blocks in the cache: the eight 840 MiB segments stay reserved, ready for the next step, and only a "
        "malloc that needs room (rule 7) or empty_cache() gives them back.",
    "c2-largest-free":
        "the largest cached free block is one 415 MiB piece, but the device still has 1.44 GiB free, and a new "
        "segment of that size could be had: the larger of the two is the biggest request that could succeed. "
        "Neither is 2 GiB.",
    "c2-empty-cache":
        "every segment holds a live 425 MiB activation, so none is wholly free; and the failed malloc's release"
        " and retry had already released whatever was.",
    "c2-smaller-batch":
        "with 319 MiB activations, two of them share one old 840 MiB segment, so half the segments end up "
        "holding nothing; release and retry gives those back and the 2 GiB segment fits. Read on for how.",
})


why = explainer(WHY)  # why(pid, **fields): prediction pid's explanation, in the notebook's language

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


@ladder(TEXT, "oom_rule")
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


@ladder(TEXT, "releasable_rule")
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
                        say(TEXT, "releasable_wrong_hint"), fix=say(TEXT, "releasable_wrong_fix"))
        lines.append(f"{what}: {format_size(actual)}")
    return "; ".join(lines)
