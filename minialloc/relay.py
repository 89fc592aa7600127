"""The re-laid start of a what-if for a trace that starts mid-run: the memory the run held at its first entry,
allocated again under another config's policy.

A snapshot taken mid-run says what the run held at the first trace entry (trace.state_at_trace_start rebuilds it
from the final segments by undoing the trace's segment events): its live blocks (sizes, streams, pools) and its
cached free blocks, the cache the run built before the trace began. A run made under another config from its
start would have held the same live blocks, and a cache built by the same requests. The cache matters: the peak
after the first entry is often the cache itself (a model loaded, then freed), and a trace that reuses that cache
under one config needs new segments under one that lays it out differently.

relay_start allocates the start state again, segment by segment in address order, on each segment's stream and
in its pool: first the request that made the segment (its size: a segment is as large as its first request,
rounded), freed at once, then its blocks in address order (live blocks at their requested size, so the config
rounds them by its own rules; free blocks at their size, so the cache holds the same bytes), then it frees the
free ones. Every segment stays in use until the last one is laid, as it was when the run made the next one
(the run made a new segment because nothing cached could serve that request): its free pieces are held, and so
is the request's memory where the config left it wholly unused. The config's own policy decides the segments.
Under the recorded settings this rebuilds the run's own segments; under another it re-expresses them in that
config's (one expandable reservation per stream and pool; under max_split_size_mb the request's oversize block
stays whole, so the live blocks the run split it for need segments of their own, and the free remnants of that
split, which would need new memory there, are left out).
What it cannot know is what the requests before the trace were, so a config whose cache grows with the variety
of past requests (max_split_size_mb's unsplit oversize blocks) is predicted low, and one that would have
wasted less than the recorded settings did (expandable segments after a fragmented native run) high;
bench/relaid_whatif.py measures how far the prediction can be trusted.
"""

from __future__ import annotations

from contextlib import nullcontext

from .allocator import CachingAllocator
from .oom import OutOfMemoryError
from .sizes import K_SMALL_SIZE
from .trace import DeviceTrace


def _pieces(size: int, small: bool) -> list[int]:
    """A free block of the start state as the requests that hold it again in a pool of the same kind: a free
    piece of a small segment can be larger than a small request (kSmallSize), so it is taken in small pieces;
    a large one is taken at once (every block of the large pool is larger than kSmallSize)."""
    if not small:
        return [size]
    return [K_SMALL_SIZE] * (size // K_SMALL_SIZE) + ([size % K_SMALL_SIZE] if size % K_SMALL_SIZE else [])


def relay_start(trace: DeviceTrace, a: CachingAllocator, cache: bool = True,
                ) -> tuple[dict[int, int], tuple[int, OutOfMemoryError] | None]:
    """Allocate the start state of `trace` again on `a` (see the module docstring), then reset the peak
    statistics, so a replay's peak counts from the first entry on.

    Returns the live blocks (recorded address -> address on `a`) and, when a live block does not fit on the
    device, its requested size and the error (the re-laid run fails at the first entry). A cached block that
    does not fit is left out: on that device the run could not have kept it (PyTorch frees cached blocks and
    retries before it fails, which the allocator here does too). cache=False lays out the live blocks only."""
    live: dict[int, int] = {}
    cached: list[int] = []
    pools: dict[tuple[int, int], object] = {}
    for seg in sorted(trace.start_segments, key=lambda s: s["address"]):
        pool_id = tuple(seg.get("segment_pool_id", (0, 0)))
        small = seg.get("segment_type") == "small"
        if pool_id != (0, 0):
            pool = pools.setdefault(pool_id, a.replay_pool(pool_id))  # type: ignore[arg-type]
            routed = a.use_mem_pool(pool)  # type: ignore[arg-type]
        else:
            routed = nullcontext()
        with routed:
            made = _segment_request(a, seg, small) if cache and not seg.get("is_expandable") else None
            for b in sorted(seg["blocks"], key=lambda b: b["address"]):
                if b["state"] == "active_allocated":
                    try:
                        live[b["address"]] = a.malloc(b["requested_size"], seg["stream"])
                    except OutOfMemoryError:
                        # the cache laid so far is free memory the run would have given back for a live block:
                        # free it, so the allocator releases what it must (as PyTorch does before an OOM)
                        for ptr in cached:
                            a.free(ptr)
                        cached.clear()
                        try:
                            live[b["address"]] = a.malloc(b["requested_size"], seg["stream"])
                        except OutOfMemoryError as e:
                            return live, (b["requested_size"], e)
                elif cache:
                    for piece in _pieces(b["size"], small):
                        ptr = _cached_piece(a, piece, seg["stream"], within=made is not None)
                        if ptr is None:
                            break
                        cached.append(ptr)
            if made is not None:
                held = _hold_if_unused(a, made, seg["stream"])
                if held is not None:
                    cached.append(held)
    for ptr in cached:
        a.free(ptr)
    a.reset_peak_memory_stats()
    return live, None


def _hold_if_unused(a: CachingAllocator, ptr: int, stream: int) -> int | None:
    """The segment request's memory at ptr, held as cache when the config left it wholly unused (an oversize
    block max_split_size_mb would not split for the segment's blocks), so a later segment's request cannot take
    it: in the run, this segment was still in use when the later one was made."""
    block = next((b for b in a.blocks() if b.ptr == ptr), None)
    if block is None or block.allocated or block.is_split():
        return None
    return _cached_piece(a, block.size, stream, within=True)


def _segment_request(a: CachingAllocator, seg: dict, small: bool) -> int | None:
    """Make (and free) the request that created a segment of the start state; its address, or None where the
    device has no room for it.

    A large segment is as large as its first request, rounded (a 20 MiB one served a medium request, which
    rounds to no more); a small one was made by a request of at most kSmallSize. Under another config that
    request leaves its own trace (an oversize block max_split_size_mb never splits, a range of an expandable
    segment), and the segment's blocks take that memory again where the config lets them."""
    try:
        ptr = a.malloc(min(seg["total_size"], K_SMALL_SIZE) if small else seg["total_size"], seg["stream"])
    except OutOfMemoryError:
        return None  # on this device the run could not have kept it
    a.free(ptr)
    return ptr


def _cached_piece(a: CachingAllocator, size: int, stream: int, within: bool) -> int | None:
    """A piece of the run's cache allocated again, or None where the device has no room for it.

    within: the piece belongs to a segment whose request was just made again, so it may only take memory that
    request reserved: a piece the config would need new memory for is cached free space the config does not
    have (max_split_size_mb keeps the request's oversize block whole, so the run's remnants of splitting it
    never exist), and it is given back at once."""
    reserved = a.memory_reserved()
    try:
        ptr = a.malloc(size, stream)
    except OutOfMemoryError:
        return None
    if within and a.memory_reserved() > reserved:
        a.free(ptr)
        a.release_cached_segment(ptr)
        return None
    return ptr
