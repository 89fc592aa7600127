"""The snapshot writer: an allocator's blocks in torch.cuda.memory._snapshot()'s schema (see snapshot.py).

PyTorch builds the same dict from DeviceCachingAllocator::snapshot (the segments, from get_all_blocks) and
NativeCachingAllocator::snapshot (the traces, then the 'snapshot' trace entry). CachingAllocator.snapshot()
calls take_snapshot under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable

from .blocks import Block
from .history import History

__all__ = ["take_snapshot"]


def take_snapshot(blocks: Iterable[Block], device_index: int, history: History | None, settings: dict) -> dict:
    """Segments (each mapped range of blocks, from its first block), device_traces, allocator_settings and
    external_annotations. `blocks` is every mapped block (get_all_blocks); a 'snapshot' entry is recorded."""
    segments = []
    total_active = 0
    for head in blocks:
        if head.prev is not None and head.prev.mapped:
            continue  # not the first block of a segment (or of a mapped range, when expandable)
        seg_blocks = []
        seg = {
            "device": device_index, "address": head.ptr, "total_size": 0, "allocated_size": 0,
            "active_size": 0, "requested_size": 0, "stream": head.stream,
            "segment_type": "small" if head.pool.is_small else "large",
            "segment_pool_id": head.pool.pool_id, "is_expandable": head.segment is not None, "frames": [],
            "blocks": seg_blocks,
        }
        b: Block | None = head
        while b is not None and b.mapped:
            active = b.allocated or b.event_count > 0 or bool(b.stream_uses)
            state = "active_allocated" if b.allocated else ("active_pending_free" if active else "inactive")
            seg_blocks.append({"address": b.ptr, "size": b.size, "requested_size": b.requested_size,
                               "state": state, "frames": list(b.frames)})
            seg["total_size"] += b.size
            if b.allocated:
                seg["allocated_size"] += b.size
            if active:
                seg["active_size"] += b.size
                seg["requested_size"] += b.requested_size
            b = b.next
        total_active += seg["active_size"]
        segments.append(seg)
    segments.sort(key=lambda s: s["address"])
    # PyTorch gathers the traces first and then records the 'snapshot' entry (NativeCachingAllocator::snapshot
    # calls trace() before DeviceCachingAllocator::snapshot): it shows in the NEXT snapshot.
    traces = [] if history is None else history.trace()
    if history is not None:
        history.record("snapshot", 0, total_active, 0)
    return {
        "segments": segments,
        "device_traces": [traces],
        "allocator_settings": settings,
        "external_annotations": [] if history is None else [dict(a) for a in history.annotations],
    }
