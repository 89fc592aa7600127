"""The simulated GPU: a driver that does the accounting of a real one and nothing else.

A real CUDA driver hands out physical memory in 2 MiB pages and maps them at any virtual address it likes, so
`cudaMalloc(n)` succeeds whenever enough pages are free, however scattered they are. Fragmentation therefore
does not live in the driver; it lives in the caching allocator's segments (see allocator.py). SimulatedGPU models
exactly that: it counts pages, hands out deterministic addresses, and stores no data, so an 80 GiB simulated GPU
costs no host memory.

Data mode, `SimulatedGPU(capacity, store_data=True)` (up to 1 GiB), returns a DataGPU: the same device with host
bytes behind its memory, for what needs data (debug guards in debug.py, compaction in compaction.py). Each malloc'd
allocation and each physical handle gets a zeroed NumPy uint8 array, and a virtual address resolves through its
page's mapping to its handle's bytes, as on the real device. Accounting-only devices never run that code.

It offers the two driver interfaces the allocator uses:
- runtime malloc/free (cudaMalloc, cudaFree, cudaMemGetInfo);
- virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap,
  cuMemRelease, cuMemAddressFree, cuMemGetAllocationGranularity), with the driver's rules: sizes and offsets
  are whole pages, a page cannot be mapped twice, only mapped pages can be unmapped.

Streams and events. Work queued on a stream is modelled as unfinished until you call `synchronize(stream)` (or
`synchronize()` for every stream): an event recorded on a stream is ready only after that. This is what makes
`record_stream` observable: a block used on a side stream stays "pending free" until that stream is synchronized.

Fault injection for tests: `fail_next_mallocs(k)` makes the next k device allocations (malloc or mem_create)
report out-of-memory even if pages are free. The page accounting, the fault injection and the counters are
PageBudget's (base.py), shared with CudaGPU; the interface is the Device protocol there.

Placement (replaying a real run): `place_next(address)` makes the next `malloc` return that address, and
`place_next_reservation(address)` the next `mem_address_reserve`; a placed range may not overlap a live one. A
replay rebuilds a recorded run's segments at the addresses the run's snapshot names, so every allocation can be
compared with the recorded one (minialloc.replay). A real driver chooses its own addresses: CudaGPU has no
`supports_placement`, and the allocator refuses to restore a state on it.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

import numpy as np

from ..kernels import reference
from ..sizes import PAGE_SIZE, GiB, format_size, parse_size
from .base import DeviceError, PageBudget
from .data import HostData

_BASE_ADDRESS = 0x7F00_0000_0000  # where real CUDA allocations tend to live; any non-zero start would do
_VA_BASE_ADDRESS = 0x7E00_0000_0000  # reserved virtual ranges live apart from cudaMalloc'd ones
MAX_DATA_CAPACITY = 1 * GiB  # data mode holds every device byte in host memory: keep that small


@dataclass
class SimEvent:
    """A CUDA event recorded on a simulated stream (a StreamEvent): ready once the stream is synchronized."""

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


class SimulatedGPU(PageBudget):
    """An accounting-only GPU of `capacity` bytes (an int, or a string such as "8GiB" or "80GB").

    store_data=True gives a DataGPU instead: the same GPU with host bytes behind its memory."""

    kind = "sim"
    granularity = PAGE_SIZE
    supports_placement = True  # place_next / place_next_reservation (a real driver picks its own addresses)
    # what only the simulator offers: putting memory at a recorded run's addresses (replay from a rebuilt state)
    PLACEMENT_METHODS = ("place_next", "place_next_reservation", "drop_placements", "reservation_at")

    def __new__(cls, *args: object, store_data: bool = False, **kwargs: object) -> SimulatedGPU:
        return super().__new__(DataGPU if store_data and cls is SimulatedGPU else cls)

    def __init__(self, capacity: int | str = "8GiB", index: int = 0, name: str = "Simulated GPU",
                 store_data: bool = False) -> None:
        # store_data is read by __new__, which picked the class: DataGPU when True
        total = parse_size(capacity)
        if total < PAGE_SIZE:
            raise ValueError(f"capacity must be at least one 2 MiB page, got {format_size(total)}")
        self.index = index
        self.name = name
        self.total_memory = total
        self._init_budget(limit=total // PAGE_SIZE * PAGE_SIZE)  # whole pages: a partial page holds nothing
        self._lock = threading.Lock()
        self._next_address = _BASE_ADDRESS
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
        self._placed: list[int] = []  # addresses the next mallocs must return, in order (place_next)
        self._placed_va: list[int] = []  # the same for mem_address_reserve

    def __repr__(self) -> str:
        free, total = self.mem_get_info()
        return f"SimulatedGPU({format_size(total)}, {format_size(free)} free)"

    # -- runtime API ------------------------------------------------------------------------------------------
    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes, as cudaMemGetInfo: free counts whole free pages."""
        return self._limit - self._used, self.total_memory  # type: ignore[operator]

    def data(self) -> HostData | None:
        """None: an accounting-only GPU has no bytes (a DataGPU has)."""
        return None

    def process_memory_info(self) -> list[tuple[int, int]]:
        """[]: no NVML on a simulated GPU, so the OOM message has no per-process lines (as PyTorch without NVML)."""
        return []

    def place_next(self, *addresses: int) -> None:
        """Make the next mallocs return these addresses, in order (a replay at a recorded run's addresses)."""
        for a in addresses:
            if isinstance(a, bool) or not isinstance(a, int) or a <= 0 or a % 512:
                raise DeviceError(f"place_next: {a!r} is not a positive, 512-byte aligned address")
        with self._lock:
            self._placed.extend(addresses)

    def drop_placements(self) -> None:
        """Forget placements no malloc used (a replay places a segment only for the malloc that made it)."""
        with self._lock:
            self._placed.clear()
            self._placed_va.clear()

    def place_next_reservation(self, address: int) -> None:
        """Make the next mem_address_reserve return this address (an expandable segment's recorded range)."""
        if isinstance(address, bool) or not isinstance(address, int) or address <= 0 or address % PAGE_SIZE:
            raise DeviceError(f"place_next_reservation: {address!r} is not a positive, 2 MiB aligned address")
        with self._lock:
            self._placed_va.append(address)

    @staticmethod
    def _check_free_range(ranges: dict[int, int], start: int, size: int, what: str) -> None:
        # a linear scan: placement happens once per restored segment, never on the replay's hot path
        for other, osize in ranges.items():
            if other < start + size and start < other + osize:
                raise DeviceError(f"{what}: {start:#x}+{size} overlaps the live range {other:#x}+{osize}")

    def malloc(self, nbytes: int) -> int:
        """cudaMalloc: a new address, aligned to 2 MiB; raises DeviceOutOfMemory when pages run out."""
        self._check_malloc_size(nbytes)
        with self._lock:
            charge = self._charge(nbytes, "malloc")
            if self._placed:
                address = self._placed.pop(0)
                try:
                    self._check_free_range(self._allocations, address, nbytes, "malloc at a placed address")
                except DeviceError:
                    self._refund(charge)
                    raise
                # fresh addresses stay above every placed one, so the two never collide (charge: whole pages)
                self._next_address = max(self._next_address, address + charge)
            else:
                address = self._next_address
                # addresses are never reused: a stale pointer can always be told from a live one
                self._next_address += charge
            return self._malloc_done(address, nbytes)

    def free(self, address: int) -> None:
        """cudaFree: only the exact address malloc returned is accepted."""
        with self._lock:
            self._free_done(self._malloc_taken_back(address))

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
            if self._placed_va:
                va = self._placed_va.pop(0)
                self._check_free_range(self._reservations, va, size, "mem_address_reserve at a placed address")
                self._next_va = max(self._next_va, va + size + PAGE_SIZE)
            else:
                va = self._next_va
                self._next_va += size + PAGE_SIZE  # a guard page between ranges keeps them apart
            self._reservations[va] = size
            return va

    def reservation_at(self, va: int) -> int | None:
        """The start of the reserved range holding address va, or None."""
        for start, size in self._reservations.items():
            if start <= va < start + size:
                return start
        return None

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
            self._charge(size, "mem_create")
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
            self._refund(size)
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

    def mapping(self, va: int) -> tuple[int, int] | None:
        """(handle, offset in the handle) of the physical page behind address va, or None where nothing is mapped."""
        return self._mapped.get(va - va % PAGE_SIZE)

    def mapped_addresses(self) -> list[int]:
        """The start address of every mapped page, in order."""
        return sorted(self._mapped)

    @property
    def mapped_pages(self) -> int:
        return len(self._mapped)

    # -- streams and events --------------------------------------------------------------------------------------
    def launch(self, stream: int = 0) -> None:
        """Queue a unit of work on a stream (a kernel, in the real thing); it completes at synchronize."""
        stream = _check_stream(stream)
        with self._lock:
            self._queued[stream] = self._queued.get(stream, 0) + 1

    def record_event(self, stream: int = 0) -> SimEvent:
        """cudaEventRecord: the event is ready when all work queued on `stream` so far has completed.

        The simulation treats the recording itself as queued work, so an event is never ready before the stream
        is synchronized: that keeps record_stream's deferred frees visible in a teaching setting.
        """
        stream = _check_stream(stream)
        with self._lock:
            ticket = self._queued.get(stream, 0) + 1
            self._queued[stream] = ticket
            return SimEvent(stream, ticket, self)

    def synchronize(self, stream: int | None = None) -> None:
        """cudaStreamSynchronize(stream), or cudaDeviceSynchronize() when stream is None."""
        with self._lock:
            streams = list(self._queued) if stream is None else [_check_stream(stream)]
            for s in streams:
                self._completed[s] = self._queued.get(s, 0)


class DataGPU(SimulatedGPU):
    """A SimulatedGPU with host bytes behind its memory, what SimulatedGPU(capacity, store_data=True) returns.

    view(ptr, nbytes) is a writable NumPy view of device bytes within one allocation, or one handle's contiguously
    mapped pages; views() covers a range over several handles; copy() is memmove. Bytes that are not allocated,
    not mapped (or not accessible), or past the end of their allocation raise DeviceError, as a GPU would fault."""

    store_data = True

    def __init__(self, capacity: int | str = "64MiB", index: int = 0, name: str = "Simulated GPU",
                 store_data: bool = True) -> None:
        if parse_size(capacity) > MAX_DATA_CAPACITY:
            raise ValueError(
                f"store_data=True keeps every device byte in host memory, so it is limited to "
                f"{format_size(MAX_DATA_CAPACITY)}; got a capacity of {format_size(parse_size(capacity))}. "
                "Use a smaller capacity, or store_data=False for accounting only"
            )
        super().__init__(capacity, index, name)
        self._data: dict[int, np.ndarray] = {}  # allocation address -> its bytes
        self._starts: list[int] = []  # the same addresses, sorted, to find the allocation around an address
        self._handle_data: dict[int, np.ndarray] = {}  # physical handle -> its bytes

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + ", store_data=True)"

    def data(self) -> HostData:
        """The bytes, worked on by the kernels' NumPy twins."""
        return HostData(self)

    # each call that creates or destroys device memory does the same to its bytes
    def malloc(self, nbytes: int) -> int:
        address = super().malloc(nbytes)
        with self._lock:
            self._data[address] = np.zeros(nbytes, np.uint8)
            bisect.insort(self._starts, address)
        return address

    def free(self, address: int) -> None:
        super().free(address)
        with self._lock:
            del self._data[address]
            del self._starts[bisect.bisect_left(self._starts, address)]

    def mem_create(self, size: int) -> int:
        handle = super().mem_create(size)
        with self._lock:
            self._handle_data[handle] = np.zeros(size, np.uint8)
        return handle

    def mem_release(self, handle: int) -> None:
        super().mem_release(handle)
        with self._lock:
            del self._handle_data[handle]

    def _piece(self, ptr: int, nbytes: int) -> np.ndarray:
        """The bytes from ptr: all nbytes when ptr is in an allocation; in mapped memory as many as one handle's
        contiguously mapped pages hold (the caller asks again for the rest)."""
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i >= 0:
            start = self._starts[i]
            buf = self._data[start]
            if ptr < start + buf.size:
                if ptr + nbytes > start + buf.size:
                    raise DeviceError(f"{ptr:#x}+{nbytes} runs past the end of the allocation at {start:#x} "
                                      f"({buf.size} bytes)")
                return buf[ptr - start : ptr - start + nbytes]
        page = ptr - ptr % PAGE_SIZE
        mapping = self._mapped.get(page)
        if mapping is None:
            raise DeviceError(f"{ptr:#x} is not device memory: not allocated, or not mapped")
        if page not in self._accessible:
            raise DeviceError(f"{ptr:#x} is mapped but not accessible: mem_set_access was not called")
        handle, offset = mapping
        end = page + PAGE_SIZE
        while end < ptr + nbytes and self._mapped.get(end) == (handle, offset + end - page) and end in self._accessible:
            end += PAGE_SIZE
        begin = offset + ptr - page
        return self._handle_data[handle][begin : begin + min(nbytes, end - ptr)]

    def views(self, ptr: int, nbytes: int) -> list[np.ndarray]:
        """Writable views of the device bytes [ptr, ptr + nbytes), in address order: one per allocation, or per run
        of pages mapped from one handle."""
        if isinstance(ptr, bool) or not isinstance(ptr, int) or isinstance(nbytes, bool) or not isinstance(nbytes, int):
            raise TypeError(f"ptr and nbytes must be ints, got {ptr!r} and {nbytes!r}")
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            pieces = [self._piece(ptr, nbytes)]
            done = pieces[0].size
            while done < nbytes:
                pieces.append(self._piece(ptr + done, nbytes - done))
                done += pieces[-1].size
            return pieces

    def view(self, ptr: int, nbytes: int) -> np.ndarray:
        """A writable view of [ptr, ptr + nbytes); the range must lie in one allocation or one handle's pages."""
        pieces = self.views(ptr, nbytes)
        if len(pieces) != 1:
            raise DeviceError(f"{ptr:#x}+{nbytes} spans {len(pieces)} physical allocations: use views()")
        return pieces[0]

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """memmove on device memory: afterwards [dst, dst + nbytes) holds what [src, src + nbytes) held before.

        Within one buffer this is the move kernel's NumPy twin, between two the block_copy twin; ranges over
        several handles go through a host copy."""
        if not reference.ranges_overlap(dst, src, nbytes):
            d, s = self.views(dst, nbytes), self.views(src, nbytes)
            if len(d) == len(s) == 1:
                reference.block_copy(d[0], 0, s[0], 0, nbytes)
                return
        else:
            lo = min(dst, src)
            whole = self.views(lo, max(dst, src) + nbytes - lo)
            if len(whole) == 1:
                reference.move(whole[0], dst - lo, src - lo, nbytes)
                return
        data = np.concatenate(self.views(src, nbytes))  # a copy, so overlapping ranges are safe
        done = 0
        for piece in self.views(dst, nbytes):
            piece[:] = data[done : done + piece.size]
            done += piece.size
