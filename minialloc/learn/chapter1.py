"""Chapter 1 (why a caching allocator): the facts the predictions are revealed against, and the exercise checkers.

The hidden references live here, not in the notebook: a learner who opens this file reads the answers, which is
fine for a self-learner and no secret worth guarding; the notebook itself gives none away.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..allocator import CachingAllocator, round_size
from ..device import SimulatedGPU
from ..lang import messages
from ..sizes import MiB, format_size
from . import Wrong, call, expect, explainer, ladder, say

__all__ = ["TEXT", "WHY", "check_get_segment", "check_step_peak", "request_facts", "why"]

# Every sentence a learner reads from this chapter's checkers, in English, shown in the notebook's language
# (minialloc.lang).
TEXT = messages("minialloc.learn.chapter1.TEXT", {
    "case_fits": "a cached segment fits",
    "case_exact": "a cached segment of exactly the size asked for",
    "case_room": "nothing cached fits, the device has room",
    "case_release": "nothing cached fits, the device is full, the cache holds enough",
    "case_oom": "nothing fits even after releasing the cache",
    "case": "case '{what}' (request {size}, cache {cache})",
    "no_call": "no driver call",
    "malloc_failed": "malloc failed",
    "should_raise":
        "{case}: your function returned {got}, but there is not enough memory even after releasing the cache",
    "should_raise_hint": "after the second device.malloc fails, let its MemoryError propagate: that is the OOM",
    "should_serve": "{case}: your function raised MemoryError, but the request can be served",
    "should_serve_hint": "a MemoryError from the device is the signal to release the cache and try again, once",
    "not_address": "{case}: your function returned {got}, not an address",
    "not_address_hint": "return the address: the cached segment's, or what device.malloc returned",
    "calls": "{case}: your driver calls were [{calls}], which is not what the allocator does",
    "calls_hint":
        "compare your driver calls with the three places a segment can come from, in rule 7's order: which one "
        "needs no driver call, and what must have failed before the cache is released?",
    "calls_fix":
        "the order is: best fit from the cache (no driver call); else device.malloc; only if that raises, "
        "device.free every cached segment, empty the list, and device.malloc again",
    "calls_cached_hint": "a cached segment that fits is handed out without any driver call",
    "calls_release_early_hint":
        "releasing the cache costs driver calls and throws away segments the next step may want: do it only "
        "after device.malloc has refused",
    "calls_release_all_hint":
        "when the device refuses, release the whole cache, every cached segment (what empty_cache() does), "
        "not just enough of it",
    "best_fit": "{case}: you returned the segment at {address}, not the one best fit picks",
    "best_fit_hint": "best fit: the smallest cached segment of at least `size` bytes (lowest address on a tie)",
    "cache_after": "{case}: afterwards your cache holds {cache}",
    "cache_after_hint": "a segment you hand out or give back to the device must leave the cache list",
    "retry_passed":
        "{cases} cases. minialloc's allocator, asked for 400 MiB with 400 MiB cached on a 512 MiB GPU, "
        "released {released} cached segments and retried ({retries} retry), then served it",
    "not_int": "step_peak returned {got}, a {type}",
    "not_int_hint": "return a number of bytes, an int",
    "earlier_peak": "you returned {got}: the peak of an EARLIER step, still in the statistics",
    "earlier_peak_hint":
        "a peak statistic is a high-water mark: it stays as high as it ever was, across steps, until something "
        "resets it",
    "earlier_peak_fix": "call reset_peak_memory_stats() before the step, then read max_memory_allocated() after it",
    "reserved_peak":
        "you returned {got}: the peak of RESERVED memory (segments held from the device, cached free blocks "
        "included), not of allocated memory",
    "reserved_peak_hint":
        "the exercise asks for the highest memory_allocated(): use the peak statistic that goes with it",
    "after_step": "you returned {got}: what is allocated AFTER the step, not the highest point during it",
    "after_step_hint":
        "max_memory_allocated() remembers the highest point; memory_allocated() is only the current value",
    "growth": "you returned {got}: the step's growth over what was live before it",
    "growth_hint": "the weights live before the step sit on the GPU during it too: the peak counts them",
    "not_peak": "you returned {got}, which is not the highest allocated memory during the step",
    "not_peak_hint": "the statistic that keeps the highest point has to start the step at the current value",
    "not_peak_fix": "reset the peak statistics, run the step once, then read the peak",
    "peak_passed": "the step peaked at {peak}, of which {before} was live before it",
    "peak_rule":
        "chapter 1, 'Measuring a step's peak': what max_memory_allocated() remembers, and since when",
    "retry_rule":
        "chapter 1, rule 4 (best fit per stream) and rule 7 (release and retry): re-read both and follow them "
        "for this case, one driver call at a time",
})

# Why each prediction of this chapter comes out as it does: shown by learn.reveal once the learner has
# predicted, never in the notebook's visible source (a Run All would show it under the blank cell).
WHY = messages("minialloc.learn.chapter1.WHY", {
    "c1-small-request":
        "1000 B rounds up to 1024 B (rule 1), which is under 1 MiB: small pool (rule 2), whose segments are 2 "
        "MiB (rule 3). The small pool splits whenever 512 B or more remain (rule 5), so allocated counts only "
        "the 1024-byte block, while the whole 2 MiB segment is reserved.",
    "c1-large-request":
        "19.5 MiB is already a multiple of 512 B (rule 1) and over 1 MiB: large pool (rule 2). It is not under "
        "10 MiB, so its segment is its size rounded up to 2 MiB: 20 MiB (rule 3). The 512 KiB left over is not "
        "over 1 MiB, so the large pool does not split it off (rule 5): the tensor's block is the whole segment,"
        " and allocated counts 20 MiB, not 19.5.",
    "c1-empty-cache":
        "a segment goes back to the device only whole: y, alive in the middle, pins all 20 MiB, and the free "
        "pieces around it (6 MiB before, 8 MiB after) stay reserved.",
    "c1-stream":
        "after the free, p's block is in state {state}: it waits until the work queued on stream 1 so far is "
        "done, because reusing it now would let a new tensor overwrite memory a stream 1 kernel may still read.",
    "c1-peak":
        "the peak is reached just before the workspace is freed: weights + activations + workspace. "
        "memory_allocated() after the step has fallen back to the weights alone.",
})


why = explainer(WHY)  # why(pid, **fields): prediction pid's explanation, in the notebook's language


def request_facts(size: int, capacity: str = "8GiB") -> tuple[int, str, int, int, int]:
    """What one malloc(size) does to a fresh allocator, measured on minialloc:
    (rounded size, pool, segment size, allocated, reserved)."""
    alloc = CachingAllocator(SimulatedGPU(capacity), "")
    alloc.malloc(size)
    (seg,) = alloc.snapshot()["segments"]
    return (round_size(size, 0), seg["segment_type"], seg["total_size"], alloc.memory_allocated(),
            alloc.memory_reserved())


# --- exercise c1-retry: release and retry (rule 7, without max_split_size) --------------------------------------


class _RecordingGPU(SimulatedGPU):
    """A simulated GPU that writes down every driver call, so the checker can compare call sequences."""

    def __init__(self, capacity: int | str) -> None:
        super().__init__(capacity)
        self.calls: list[tuple[str, int]] = []

    def malloc(self, nbytes: int) -> int:
        try:
            address = super().malloc(nbytes)
        except MemoryError:
            self.calls.append(("malloc failed", nbytes))
            raise
        self.calls.append(("malloc", nbytes))
        return address

    def free(self, address: int) -> None:
        self.calls.append(("free", self.allocation_size(address) or 0))
        super().free(address)


def _reference_get_segment(device: Any, cache: list[tuple[int, int]], size: int) -> int:
    fits = [entry for entry in cache if entry[1] >= size]
    if fits:
        best = min(fits, key=lambda e: (e[1], e[0]))  # best fit: smallest, then lowest address
        cache.remove(best)
        return best[0]
    try:
        return device.malloc(size)
    except MemoryError:
        for address, _ in cache:
            device.free(address)
        cache.clear()
        return device.malloc(size)  # a second failure is the out-of-memory error


def _setup(capacity: str, cached: list[int], busy: int = 0) -> tuple[_RecordingGPU, list[tuple[int, int]]]:
    """A GPU whose cache holds segments of the given sizes (they occupy the device), plus `busy` bytes in use."""
    gpu = _RecordingGPU(capacity)
    cache = [(gpu.malloc(n), n) for n in cached]
    if busy:
        gpu.malloc(busy)
    gpu.calls.clear()
    return gpu, cache


def _describe(calls: list[tuple[str, int]]) -> str:
    def kind(what: str) -> str:
        return say(TEXT, "malloc_failed") if what == "malloc failed" else what  # malloc and free are names

    return ", ".join(f"{kind(what)} {format_size(n)}" for what, n in calls) or say(TEXT, "no_call")


# (description's message id, capacity, cached segment sizes, other memory in use, request)
_RETRY_CASES = [
    ("case_fits", "1GiB", [30 * MiB, 20 * MiB, 64 * MiB], 0, 18 * MiB),
    ("case_exact", "1GiB", [30 * MiB, 18 * MiB, 64 * MiB], 0, 18 * MiB),  # "at least": a block of equal size fits
    ("case_room", "1GiB", [10 * MiB], 0, 20 * MiB),
    ("case_release", "512MiB", [300 * MiB, 100 * MiB], 0, 400 * MiB),
    ("case_oom", "512MiB", [100 * MiB], 300 * MiB, 400 * MiB),
]


@ladder(TEXT, "retry_rule")
def check_get_segment(get_segment: Callable[..., int]) -> str:
    """Exercise c1-retry: get_segment(device, cache, size) must find a cached segment by best fit, else ask the
    device, and only when the device refuses, release every cached segment and ask once more."""
    for what, capacity, cached, busy, size in _RETRY_CASES:
        gpu, cache = _setup(capacity, cached, busy)
        ref_gpu, ref_cache = _setup(capacity, cached, busy)
        try:
            expected: int | None = _reference_get_segment(ref_gpu, ref_cache, size)
        except MemoryError:
            expected = None
        raised = False
        try:
            got: int | None = call(get_segment, gpu, cache, size)
        except MemoryError:
            got, raised = None, True
        case = say(TEXT, "case", what=say(TEXT, what), size=format_size(size),
                   cache=[format_size(n) for n in cached])
        if expected is None:
            expect(raised, say(TEXT, "should_raise", case=case, got=repr(got)), say(TEXT, "should_raise_hint"),
                   rule=say(TEXT, "retry_rule"))
        else:
            expect(not raised, say(TEXT, "should_serve", case=case), say(TEXT, "should_serve_hint"),
                   rule=say(TEXT, "retry_rule"))
            expect(isinstance(got, int), say(TEXT, "not_address", case=case, got=repr(got)),
                   say(TEXT, "not_address_hint"))
        if gpu.calls != ref_gpu.calls:
            if not ref_gpu.calls:
                hint = "calls_cached_hint"
            elif gpu.calls and gpu.calls[0][0] == "free" and ref_gpu.calls[0][0] != "free":
                hint = "calls_release_early_hint"
            elif 0 < sum(c[0] == "free" for c in gpu.calls) < sum(c[0] == "free" for c in ref_gpu.calls):
                hint = "calls_release_all_hint"
            else:
                hint = "calls_hint"
            raise Wrong(say(TEXT, "calls", case=case, calls=_describe(gpu.calls)), say(TEXT, hint),
                        rule=say(TEXT, "retry_rule"), fix=say(TEXT, "calls_fix"))
        if expected is not None:
            # addresses of fresh mallocs depend on the order of calls, already compared: compare the outcome
            expect(got == expected, say(TEXT, "best_fit", case=case, address=f"{got:#x}"), say(TEXT, "best_fit_hint"),
                   rule=say(TEXT, "retry_rule"))
        expect(sorted(cache) == sorted(ref_cache),
               say(TEXT, "cache_after", case=case, cache=[format_size(n) for _, n in cache]),
               say(TEXT, "cache_after_hint"), rule=say(TEXT, "retry_rule"))
    # the same situation through minialloc's own allocator: it releases and retries the same way
    alloc = CachingAllocator(SimulatedGPU("512MiB"), "")
    for p in [alloc.malloc(n) for n in (300 * MiB, 100 * MiB)]:  # both live at once: two segments
        alloc.free(p)
    alloc.malloc(400 * MiB)
    s = alloc.memory_stats()
    return say(TEXT, "retry_passed", cases=len(_RETRY_CASES), released=s["num_device_free"],
               retries=s["num_alloc_retries"])


# --- exercise c1-step-peak: measure one step's peak ---------------------------------------------------------------


def _big_step(alloc: CachingAllocator) -> None:
    x = alloc.malloc(900 * MiB)
    alloc.free(x)
    alloc.empty_cache()  # so that no reserved figure equals this step's peak: each wrong answer is told apart


def _small_step(alloc: CachingAllocator) -> None:
    # the peak (activations plus the second workspace) is in the middle; the second workspace does not fit the
    # first one's cached block, so peak reserved (a new segment) is above peak allocated
    acts = [alloc.malloc(40 * MiB) for _ in range(3)]
    ws = alloc.malloc(100 * MiB)
    alloc.free(ws)
    ws = alloc.malloc(110 * MiB)
    alloc.free(ws)
    for p in acts:
        alloc.free(p)


@ladder(TEXT, "peak_rule")
def check_step_peak(step_peak: Callable[[CachingAllocator, Callable[[CachingAllocator], None]], int]) -> str:
    """Exercise c1-step-peak: step_peak(alloc, step) runs step(alloc) once and returns the highest allocated
    memory during it (memory live before the step included), whatever ran before."""
    alloc = CachingAllocator(SimulatedGPU("8GiB"), "")
    _big_step(alloc)  # an earlier, bigger peak that must not leak into the measurement
    weights = alloc.malloc(200 * MiB)  # live during the step: it counts
    before = alloc.memory_allocated()
    got = call(step_peak, alloc, _small_step)
    ref = CachingAllocator(SimulatedGPU("8GiB"), "")
    _big_step(ref)
    ref.malloc(200 * MiB)
    ref.reset_peak_memory_stats()
    _small_step(ref)
    expected = ref.max_memory_allocated()
    expect(isinstance(got, int) and not isinstance(got, bool),
           say(TEXT, "not_int", got=repr(got), type=type(got).__name__), say(TEXT, "not_int_hint"))
    shown = format_size(got)
    if got >= 900 * MiB:
        raise Wrong(say(TEXT, "earlier_peak", got=shown), say(TEXT, "earlier_peak_hint"),
                    fix=say(TEXT, "earlier_peak_fix"))
    if got in (alloc.max_memory_reserved(), alloc.memory_reserved()) and got != expected:
        raise Wrong(say(TEXT, "reserved_peak", got=shown), say(TEXT, "reserved_peak_hint"))
    expect(got != alloc.memory_allocated(), say(TEXT, "after_step", got=shown), say(TEXT, "after_step_hint"))
    expect(got != expected - before, say(TEXT, "growth", got=shown), say(TEXT, "growth_hint"))
    expect(got == expected, say(TEXT, "not_peak", got=shown), say(TEXT, "not_peak_hint"),
           fix=say(TEXT, "not_peak_fix"))
    alloc.free(weights)
    return say(TEXT, "peak_passed", peak=shown, before=format_size(before))
