"""The simulated GPU: a driver that does the accounting of a real one and nothing else.

A real CUDA driver hands out physical memory in 2 MiB pages and maps them at any virtual address it likes, so
`cudaMalloc(n)` succeeds whenever enough pages are free, however scattered they are. Fragmentation therefore
does not live in the driver; it lives in the caching allocator's segments (see allocator.py). SimulatedGPU models
exactly that: it counts pages, hands out deterministic addresses, and stores no data, so an 80 GiB simulated GPU
costs no host memory.

It offers the two driver interfaces the allocator uses:
- runtime malloc/free (cudaMalloc, cudaFree, cudaMemGetInfo);
- virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap,
  cuMemRelease, cuMemAddressFree, cuMemGetAllocationGranularity), with the driver's rules: sizes and offsets
  are whole pages, a page cannot be mapped twice, only mapped pages can be unmapped.

Streams and events. Work queued on a stream is modelled as unfinished until you call `synchronize(stream)` (or
`synchronize()` for every stream): an event recorded on a stream is ready only after that. This is what makes
`record_stream` observable: a block used on a side stream stays "pending free" until that stream is synchronized.

Fault injection for tests: `fail_next_mallocs(k)` makes the next k device allocations (malloc or mem_create)
report out-of-memory even if pages are free.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .sizes import PAGE_SIZE, format_size, parse_size

_BASE_ADDRESS = 0x7F00_0000_0000  # where real CUDA allocations tend to live; any non-zero start would do
_VA_BASE_ADDRESS = 0x7E00_0000_0000  # reserved virtual ranges live apart from cudaMalloc'd ones


class DeviceError(RuntimeError):
    """A misuse of the driver: an unknown pointer, a double map, a size that is not whole pages."""


class DeviceOutOfMemory(MemoryError):
    """The driver has not enough free physical pages (cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY)."""


@dataclass
class Event:
    """A CUDA event recorded on a stream: ready once the stream is synchronized."""

    stream: int
    ticket: int
    device: SimulatedGPU = field(repr=False)

    def query(self) -> bool:
        return self.device._completed.get(self.stream, 0) >= self.ticket

    def synchronize(self) -> None:
        self.device.synchronize(self.stream)


def _check_stream(stream: object) -> int:
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < 0:
        raise TypeError(f"stream must be a non-negative int (0 is the default stream), got {stream!r}")
    return stream


class SimulatedGPU:
    """An accounting-only GPU of `capacity` bytes (an int, or a string such as "8GiB" or "80GB")."""

    kind = "sim"
    granularity = PAGE_SIZE

    def __init__(self, capacity: int | str = "8GiB", index: int = 0, name: str = "Simulated GPU") -> None:
        total = parse_size(capacity)
        if total < PAGE_SIZE:
            raise ValueError(f"capacity must be at least one 2 MiB page, got {format_size(total)}")
        self.index = index
        self.name = name
        self.total_memory = total
        self._total_pages = total // PAGE_SIZE
        self._used_pages = 0
        self._lock = threading.Lock()
        self._next_address = _BASE_ADDRESS
        self._allocations: dict[int, int] = {}  # address -> size, from malloc
        # virtual memory: reserved ranges, physical handles, and which page of which range maps which handle
        self._next_va = _VA_BASE_ADDRESS
        self._reservations: dict[int, int] = {}  # va start -> size
        self._next_handle = 1
        self._handles: dict[int, int] = {}  # handle -> size
        self._mapped: dict[int, tuple[int, int]] = {}  # page-aligned va -> (handle, offset in handle)
        self._handle_maps: dict[int, int] = {}  # handle -> how many pages of it are mapped
        self._accessible: set[int] = set()  # page-aligned vas with access set
        # streams: tickets of queued work and of completed work
        self._queued: dict[int, int] = {}
        self._completed: dict[int, int] = {}
        self._fail_next = 0
        self.num_mallocs = 0
        self.num_frees = 0

    def __repr__(self) -> str:
        free, total = self.mem_get_info()
        return f"SimulatedGPU({format_size(total)}, {format_size(free)} free)"

    # -- runtime API ------------------------------------------------------------------------------------------
    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes, as cudaMemGetInfo: free counts whole free pages."""
        return (self._total_pages - self._used_pages) * PAGE_SIZE, self.total_memory

    @property
    def used_bytes(self) -> int:
        return self._used_pages * PAGE_SIZE

    def fail_next_mallocs(self, k: int = 1) -> None:
        """Make the next k device allocations (malloc or mem_create) fail with DeviceOutOfMemory."""
        if k < 0:
            raise ValueError("k must be >= 0")
        self._fail_next = k

    def _take_pages(self, nbytes: int, what: str) -> None:
        pages = -(-nbytes // PAGE_SIZE)
        if self._fail_next > 0:
            self._fail_next -= 1
            raise DeviceOutOfMemory(f"{what}({nbytes}): out of memory (injected failure)")
        if self._used_pages + pages > self._total_pages:
            free, _ = self.mem_get_info()
            raise DeviceOutOfMemory(f"{what}({nbytes}): out of memory, {format_size(free)} free")
        self._used_pages += pages

    def malloc(self, nbytes: int) -> int:
        """cudaMalloc: a new address, aligned to 2 MiB; raises DeviceOutOfMemory when pages run out."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"malloc size must be a positive int, got {nbytes!r}")
        with self._lock:
            self._take_pages(nbytes, "malloc")
            address = self._next_address
            # addresses are never reused: a stale pointer can always be told from a live one
            self._next_address += -(-nbytes // PAGE_SIZE) * PAGE_SIZE
            self._allocations[address] = nbytes
            self.num_mallocs += 1
            return address

    def free(self, address: int) -> None:
        """cudaFree: only the exact address malloc returned is accepted."""
        with self._lock:
            nbytes = self._allocations.pop(address, None)
            if nbytes is None:
                raise DeviceError(f"free({address:#x}): invalid device pointer (not returned by malloc)")
            self._used_pages -= -(-nbytes // PAGE_SIZE)
            self.num_frees += 1

    def allocation_size(self, address: int) -> int | None:
        return self._allocations.get(address)

    # -- virtual memory management (the driver API behind expandable segments) ----------------------------------
    def mem_get_allocation_granularity(self) -> int:
        """cuMemGetAllocationGranularity: physical allocations and mappings come in multiples of this."""
        return PAGE_SIZE

    def _check_pages(self, what: str, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0 or size % PAGE_SIZE:
            raise DeviceError(f"{what}: size {size!r} is not a positive multiple of the granularity (2 MiB)")

    def mem_address_reserve(self, size: int) -> int:
        """cuMemAddressReserve: virtual address space only; costs no physical memory."""
        self._check_pages("mem_address_reserve", size)
        with self._lock:
            va = self._next_va
            self._next_va += size + PAGE_SIZE  # a guard page between ranges keeps them apart
            self._reservations[va] = size
            return va

    def mem_address_free(self, va: int, size: int) -> None:
        with self._lock:
            if self._reservations.get(va) != size:
                raise DeviceError(f"mem_address_free({va:#x}, {size}): no reservation of that size there")
            if any(va <= p < va + size for p in self._mapped):
                raise DeviceError(f"mem_address_free({va:#x}): pages are still mapped in the range")
            del self._reservations[va]

    def mem_create(self, size: int) -> int:
        """cuMemCreate: physical pages; the only call that uses capacity. Returns a handle."""
        self._check_pages("mem_create", size)
        with self._lock:
            self._take_pages(size, "mem_create")
            handle = self._next_handle
            self._next_handle += 1
            self._handles[handle] = size
            self._handle_maps[handle] = 0
            self.num_mallocs += 1
            return handle

    def mem_release(self, handle: int) -> None:
        """cuMemRelease: the pages return to the device once the handle is released and unmapped."""
        with self._lock:
            size = self._handles.pop(handle, None)
            if size is None:
                raise DeviceError(f"mem_release({handle}): unknown handle")
            if self._handle_maps.pop(handle):
                # the driver defers the release until the last unmap; we refuse, to surface the leak in tests
                self._handles[handle] = size
                self._handle_maps[handle] = 1
                raise DeviceError(f"mem_release({handle}): handle is still mapped; unmap it first")
            self._used_pages -= size // PAGE_SIZE
            self.num_frees += 1

    def _reservation_of(self, va: int, size: int) -> int:
        for start, rsize in self._reservations.items():
            if start <= va and va + size <= start + rsize:
                return start
        raise DeviceError(f"range {va:#x}+{size} is not inside a reserved address range")

    def mem_map(self, va: int, size: int, offset: int, handle: int) -> None:
        """cuMemMap: back [va, va+size) with the handle's pages from `offset`. Mapping over a mapped page fails."""
        self._check_pages("mem_map", size)
        with self._lock:
            if va % PAGE_SIZE or offset % PAGE_SIZE:
                raise DeviceError("mem_map: address and offset must be multiples of the granularity (2 MiB)")
            hsize = self._handles.get(handle)
            if hsize is None:
                raise DeviceError(f"mem_map: unknown handle {handle}")
            if offset + size > hsize:
                raise DeviceError(f"mem_map: offset {offset} + size {size} exceeds the handle's {hsize} bytes")
            self._reservation_of(va, size)
            pages = range(va, va + size, PAGE_SIZE)
            if any(p in self._mapped for p in pages):
                raise DeviceError(f"mem_map: a page in {va:#x}+{size} is already mapped")
            for i, p in enumerate(pages):
                self._mapped[p] = (handle, offset + i * PAGE_SIZE)
            self._handle_maps[handle] += size // PAGE_SIZE

    def mem_set_access(self, va: int, size: int) -> None:
        """cuMemSetAccess: a mapping is unusable until access is granted."""
        self._check_pages("mem_set_access", size)
        with self._lock:
            pages = range(va, va + size, PAGE_SIZE)
            if not all(p in self._mapped for p in pages):
                raise DeviceError(f"mem_set_access: {va:#x}+{size} is not entirely mapped")
            self._accessible.update(pages)

    def mem_unmap(self, va: int, size: int) -> None:
        """cuMemUnmap: every page in the range must be mapped."""
        self._check_pages("mem_unmap", size)
        with self._lock:
            pages = range(va, va + size, PAGE_SIZE)
            if not all(p in self._mapped for p in pages):
                raise DeviceError(f"mem_unmap: {va:#x}+{size} is not entirely mapped")
            for p in pages:
                handle, _ = self._mapped.pop(p)
                self._handle_maps[handle] -= 1
                self._accessible.discard(p)

    def is_accessible(self, va: int) -> bool:
        return (va - va % PAGE_SIZE) in self._accessible

    @property
    def mapped_pages(self) -> int:
        return len(self._mapped)

    # -- streams and events --------------------------------------------------------------------------------------
    def launch(self, stream: int = 0) -> None:
        """Queue a unit of work on a stream (a kernel, in the real thing); it completes at synchronize."""
        stream = _check_stream(stream)
        with self._lock:
            self._queued[stream] = self._queued.get(stream, 0) + 1

    def record_event(self, stream: int = 0) -> Event:
        """cudaEventRecord: the event is ready when all work queued on `stream` so far has completed.

        The simulation treats the recording itself as queued work, so an event is never ready before the stream
        is synchronized: that keeps record_stream's deferred frees visible in a teaching setting.
        """
        stream = _check_stream(stream)
        with self._lock:
            ticket = self._queued.get(stream, 0) + 1
            self._queued[stream] = ticket
            return Event(stream, ticket, self)

    def synchronize(self, stream: int | None = None) -> None:
        """cudaStreamSynchronize(stream), or cudaDeviceSynchronize() when stream is None."""
        with self._lock:
            streams = list(self._queued) if stream is None else [_check_stream(stream)]
            for s in streams:
                self._completed[s] = self._queued.get(s, 0)
