"""Expandable segments: one virtual range per (stream, pool) that grows by mapping physical pages on demand.

Mirrors ExpandableSegment in c10/cuda/CUDACachingAllocator.cpp (Note [Expandable Segments]). A segment reserves
address space for 1 1/8 of the device's memory, which costs nothing physical, and maps pages of `page_size`
(2 MiB for the small pool; for the large pool large_segment_size_mb, 20 MiB by default) only where blocks need
them. Because pages can be unmapped wherever they lie and mapped again at the end, free holes inside a partly used
range go back to the device: the fragmentation that makes "5 GB free, can't allocate 2 GB" cannot build up.

The allocator decides WHERE to map (allocator.py: find_expandable_block, map_block, unmap_block, with their
block edits in expandable_blocks.py); this class only talks to the driver, one page-aligned range at a time.
"""

from __future__ import annotations

from .devices.base import Device, DeviceOutOfMemory


def reservation_pages(total_memory: int, page_size: int) -> int:
    """The pages a segment reserves on a device of total_memory: enough address space for 1 1/8 of the device, so
    pages unmapped early can be mapped again at the end."""
    return -(-(total_memory + total_memory // 8) // page_size)


class ExpandableSegment:
    def __init__(self, device: Device, stream: int, page_size: int) -> None:
        self.device = device
        self.stream = stream
        self.page_size = page_size
        self.max_pages = reservation_pages(device.total_memory, page_size)
        self.ptr = device.mem_address_reserve(self.max_pages * page_size)
        self.handles: list[int | None] = []  # one physical allocation per mapped page

    @property
    def size(self) -> int:
        return self.max_pages * self.page_size

    @property
    def mapped_pages(self) -> int:
        return sum(h is not None for h in self.handles)

    def map(self, ptr: int, size: int) -> int:
        """Map the pages covering [ptr, ptr+size); ptr must be page-aligned. Returns the bytes mapped, 0 on OOM."""
        begin = (ptr - self.ptr) // self.page_size
        end = -(-(ptr + size - self.ptr) // self.page_size)
        assert self.ptr + begin * self.page_size == ptr, "map must start on a page boundary"
        while len(self.handles) < end:
            self.handles.append(None)
        created: list[int] = []
        try:
            for _ in range(begin, end):
                created.append(self.device.mem_create(self.page_size))
        except DeviceOutOfMemory:
            # all or nothing, as ExpandableSegment::map: give back what this call created
            for h in created:
                self.device.mem_release(h)
            self._trim()
            return 0
        for i, h in zip(range(begin, end), created, strict=True):
            assert self.handles[i] is None, "page already mapped"
            self.handles[i] = h
            self.device.mem_map(self.ptr + i * self.page_size, self.page_size, 0, h)
        self.device.mem_set_access(ptr, (end - begin) * self.page_size)
        return (end - begin) * self.page_size

    def unmap(self, ptr: int, size: int) -> tuple[int, int]:
        """Unmap every page lying wholly inside [ptr, ptr+size). Returns (first unmapped address, bytes)."""
        begin = -(-(ptr - self.ptr) // self.page_size)
        end = (ptr + size - self.ptr) // self.page_size
        if begin >= end:
            return ptr, 0
        # unmapping does not wait for queued work the way cudaFree does, so wait for the stream first
        self.device.synchronize(self.stream)
        for i in range(begin, end):
            h = self.handles[i]
            assert h is not None, "unmapping a page that is not mapped"
            self.handles[i] = None
            self.device.mem_unmap(self.ptr + i * self.page_size, self.page_size)
            self.device.mem_release(h)
        self._trim()
        return self.ptr + begin * self.page_size, (end - begin) * self.page_size

    def release(self) -> None:
        """Give back the address range; every page must already be unmapped."""
        assert self.mapped_pages == 0, "releasing an expandable segment with mapped pages"
        self.device.mem_address_free(self.ptr, self.size)

    def _trim(self) -> None:
        while self.handles and self.handles[-1] is None:
            self.handles.pop()
