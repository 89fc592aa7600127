"""What a device is to minialloc: the Device protocol, its errors, and the page budget both devices keep.

The allocator (allocator.py) and expandable segments (expandable.py) call exactly the methods of Device, on the
simulator (simulated.py) and on a real GPU (cuda.py) alike; debug guards and compaction reach a device's bytes
through `device.data()` (data.py), never by asking what kind of device it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..sizes import PAGE_SIZE
from ..sizes import pytorch_format_size as format_size  # the driver's message stays English

if TYPE_CHECKING:
    from .data import DeviceData


class DeviceError(RuntimeError):
    """A misuse of the driver: an unknown pointer, a double map, a size that is not whole pages."""


class DeviceOutOfMemory(MemoryError):
    """The driver has not enough free physical pages (cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY)."""


@runtime_checkable
class StreamEvent(Protocol):
    """A CUDA event recorded on a stream (cudaEventRecord): what the allocator's deferred frees wait on."""

    stream: int

    def query(self) -> bool:
        """Has all work queued on the stream before the event completed? (cudaEventQuery)"""
        ...

    def synchronize(self) -> None:
        """Wait until it has (cudaEventSynchronize)."""
        ...


@runtime_checkable
class Device(Protocol):
    """The driver calls the caching allocator and expandable segments make, as CUDA names them.

    Runtime API: malloc, free, mem_get_info. Virtual memory management (expandable segments): mem_address_reserve,
    mem_create, mem_map, mem_set_access, mem_unmap, mem_release, mem_address_free, whose sizes are multiples of
    `granularity`. Streams: record_event, synchronize. Out of memory is DeviceOutOfMemory; misuse, DeviceError.
    SimulatedGPU and CudaGPU implement it; only the simulator can also place memory at given addresses
    (SimulatedGPU.PLACEMENT_METHODS, for replays), which `supports_placement` says."""

    index: int
    name: str
    total_memory: int  # what the allocator treats as the card's size (a CudaGPU's limit, when set)
    granularity: int
    supports_placement: bool
    num_mallocs: int
    num_frees: int

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes, as cudaMemGetInfo."""
        ...

    def malloc(self, nbytes: int) -> int:
        """cudaMalloc: a new address."""
        ...

    def free(self, address: int) -> None:
        """cudaFree of an address malloc returned."""
        ...

    def mem_get_allocation_granularity(self) -> int: ...

    def mem_address_reserve(self, size: int) -> int: ...

    def mem_address_free(self, va: int, size: int) -> None: ...

    def mem_create(self, size: int) -> int: ...

    def mem_release(self, handle: int) -> None: ...

    def mem_map(self, va: int, size: int, offset: int, handle: int) -> None: ...

    def mem_set_access(self, va: int, size: int) -> None: ...

    def mem_unmap(self, va: int, size: int) -> None: ...

    def record_event(self, stream: int = 0) -> StreamEvent: ...

    def synchronize(self, stream: int | None = None) -> None: ...

    def fail_next_mallocs(self, k: int = 1) -> None: ...

    def process_memory_info(self) -> list[tuple[int, int]]:
        """[(pid, bytes)] of the processes using the device (NVML); [] where that cannot be known."""
        ...

    def data(self) -> DeviceData | None:
        """How to reach the bytes behind device addresses; None when there are none (accounting only)."""
        ...


class PageBudget:
    """The accounting both devices share: every allocation is charged in whole 2 MiB pages against an optional
    limit, the next k allocations can be made to fail (tests), malloc's addresses are tracked (so a foreign or
    double free is refused before the driver sees it), and allocations and frees are counted.

    A subclass calls _charge before asking for memory and _refund when it gives memory back (or the request
    failed after the charge); its malloc ends with _malloc_done, its free starts with _malloc_taken_back and ends
    with _free_done. `_room_phrase` finishes the out-of-memory message ("4 MiB free")."""

    _room_phrase = "free"

    def _init_budget(self, limit: int | None) -> None:
        self._limit = limit  # None: only the hardware limits (a CudaGPU without `limit`)
        self._used = 0  # bytes charged, whole pages
        self._fail_next = 0
        self._allocations: dict[int, int] = {}  # address -> size, from malloc
        self.num_mallocs = 0
        self.num_frees = 0

    @staticmethod
    def _check_malloc_size(nbytes: int) -> None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"malloc size must be a positive int, got {nbytes!r}")

    def _malloc_done(self, address: int, nbytes: int) -> int:
        self._allocations[address] = nbytes
        self.num_mallocs += 1
        return address

    def _malloc_taken_back(self, address: int) -> int:
        """The size malloc gave `address`; DeviceError for an address it did not return (or already freed)."""
        nbytes = self._allocations.pop(address, None)
        if nbytes is None:
            raise DeviceError(f"free({address:#x}): invalid device pointer (not returned by malloc)")
        return nbytes

    def _free_done(self, nbytes: int) -> None:
        self._refund(self._pages(nbytes))
        self.num_frees += 1

    def allocation_size(self, address: int) -> int | None:
        """The size malloc was asked for at `address`, None when it is not a live malloc address."""
        return self._allocations.get(address)

    @property
    def used_bytes(self) -> int:
        return self._used

    def fail_next_mallocs(self, k: int = 1) -> None:
        """Make the next k device allocations (malloc or mem_create) fail with DeviceOutOfMemory."""
        if k < 0:
            raise ValueError("k must be >= 0")
        self._fail_next = k

    @staticmethod
    def _pages(nbytes: int) -> int:
        """nbytes rounded up to whole pages: what an allocation costs."""
        return -(-nbytes // PAGE_SIZE) * PAGE_SIZE

    def _charge(self, nbytes: int, what: str) -> int:
        """Charge an allocation of nbytes; DeviceOutOfMemory when failure is injected or the limit is reached.
        Returns the charge, for _refund."""
        if self._fail_next > 0:
            self._fail_next -= 1
            raise DeviceOutOfMemory(f"{what}({nbytes}): out of memory (injected failure)")
        charge = self._pages(nbytes)
        if self._limit is not None and self._used + charge > self._limit:
            raise DeviceOutOfMemory(
                f"{what}({nbytes}): out of memory, {format_size(self._limit - self._used)} {self._room_phrase}"
            )
        self._used += charge
        return charge

    def _refund(self, charge: int) -> None:
        self._used -= charge
