"""The re-laid start of a what-if for a trace that starts mid-run: the memory the run held at its first entry,
allocated again under another config's policy.

A snapshot taken mid-run says what the run held at the first trace entry (trace.state_at_trace_start rebuilds it
from the final segments by undoing the trace's segment events): its live blocks (sizes, streams, pools) and its
cached free blocks, the cache the run built before the trace began. A run made under another config from its
start would have held the same live blocks, and a cache built by the same requests. The cache matters: the peak
after the first entry is often the cache itself (a model loaded, then freed), and a trace that reuses that cache
under one config needs new segments under one that lays it out differently.

relay_start allocates every block of the start state again, segment by segment in address order (live blocks
at their requested size, so the config rounds them by its own rules; free blocks at their size, so the cache
holds the same bytes), on its stream and in its pool, then frees the free ones: the config's own policy decides
the segments. Under the recorded settings this rebuilds the run's own layout nearly as it was; under another it
re-expresses the same reserved bytes in that config's segments (one expandable reservation per stream and pool,
unsplit oversize blocks, other roundings). What it cannot know is what the requests before the trace were, so a
config whose cache grows with the variety of past requests (max_split_size_mb's unsplit oversize blocks) is
predicted low; bench/relaid_whatif.py measures how far the prediction can be trusted.
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
    """Allocate the start state of `trace` again on `a` (see the module docstring).

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
            if not small and not seg.get("is_expandable"):
                # the request that made this segment (a large segment is as large as its first request, rounded):
                # under another config it leaves its own trace, e.g. an oversize block max_split_size_mb never
                # splits; its blocks then take that memory again where the config allows it
                try:
                    a.free(a.malloc(seg["total_size"], seg["stream"]))
                except OutOfMemoryError:
                    pass  # cache: on this device the run could not have kept it
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
                        try:
                            cached.append(a.malloc(piece, seg["stream"]))
                        except OutOfMemoryError:
                            break
    for ptr in cached:
        a.free(ptr)
    return live, None
