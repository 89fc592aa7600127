"""Debug mode (debug_guards:True): guard bytes after every block, zeroed new memory, poisoned freed memory.

A write past the end of a block lands in someone else's memory and shows up much later, far from the bug. Debug
mode makes it show up at the free of the block that overflowed:

- malloc(n) asks for n + GUARD_BYTES (64) bytes before rounding, zeroes the n bytes the caller gets and fills the
  64 after them with GUARD_PATTERN (0xFD bytes, as MSVC's debug heap marks its "no man's land");
- free checks those 64 bytes (the guard_check kernel) and raises GuardViolation with the block's address, the
  requested size and the first bad offset, after the free itself has completed, so the allocator stays consistent;
- a block going back to the pool is filled with POISON (0xDB bytes), so a use after free reads garbage that is
  easy to recognise instead of plausible old data.

The statistics stay those of the program: requested_bytes counts n, not n + 64; allocated and reserved bytes do
include the guards, since they occupy the device. A block allocated before debug_guards was switched on has no
guard and is not checked.

Debug mode needs bytes behind the addresses: a SimulatedGPU(store_data=True), where the kernels' NumPy twins run
on host buffers, or a real GPU (CudaGPU), where the CUDA kernels run. DeviceData (HostData or KernelData, which
device.data() gives; see devices/data.py) is that access: fill, guard_check, move, read and write on device
addresses; compaction uses it too.

Guards is an AllocatorExtension (extension.py): its hooks add the guard's room to each request, fill new blocks,
check guards at free and poison blocks going back to the pool. The allocator installs it while the config says
debug_guards:True; this module never imports the allocator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import ConfigError
from .devices.data import DeviceData, HostData, KernelData
from .extension import AllocatorExtension
from .kernels.reference import POISON, ZERO

if TYPE_CHECKING:
    from .blocks import Block

__all__ = ["GUARD_BYTES", "GUARD_PATTERN", "DeviceData", "GuardViolation", "Guards", "HostData", "KernelData",
           "device_data"]

GUARD_BYTES = 64  # after every block; a multiple of 4, so the pattern's phase is the same in every guard
GUARD_PATTERN = 0xFDFDFDFD


class GuardViolation(ValueError):
    """A write past the end of a block, found at its free: `ptr`, `requested_size` and `offset` (from the block's
    start) of the first guard byte that changed, and `found`, the byte there."""

    def __init__(self, ptr: int, requested_size: int, offset: int, found: int) -> None:
        super().__init__(
            f"free({ptr:#x}): a write past the end of the block at {ptr:#x} ({requested_size} bytes requested): "
            f"guard byte at offset {offset} (end + {offset - requested_size}) is {found:#04x}, expected "
            f"{GUARD_PATTERN & 0xFF:#04x}. The block has been freed and poisoned."
        )
        self.ptr, self.requested_size, self.offset, self.found = ptr, requested_size, offset, found


def device_data(device: Any) -> DeviceData | None:
    """device.data(), under the name tools and older code import: how to reach the bytes of `device`'s memory;
    None for an accounting-only SimulatedGPU."""
    return device.data()


class Guards(AllocatorExtension):
    """debug_guards for one allocator, as hooks (see the module's docstring); `device` must hold data."""

    def __init__(self, device: Any) -> None:
        data = device.data()
        if data is None:
            raise ConfigError(
                f"debug_guards:True needs memory with data behind it, but {device!r} is accounting only: "
                "use SimulatedGPU(capacity, store_data=True) (up to 1 GiB) or a real GPU (CudaGPU)"
            )
        self.data = data
        self.guarded: set[Block] = set()  # live blocks that have a guard

    def request_size(self, size: int) -> int:
        return size + GUARD_BYTES  # the rules place and round the guard with the block

    def on_malloc(self, block: Block) -> None:
        """Zero what the program asked for and write the guard after it."""
        self.guarded.add(block)
        size = block.requested_size
        self.data.fill(block.ptr, size, ZERO, block.stream)
        self.data.fill(block.ptr + size, GUARD_BYTES, GUARD_PATTERN, block.stream)

    def on_free(self, block: Block) -> GuardViolation | None:
        """At free: the block's guard, if it has one, must be intact."""
        if block not in self.guarded:
            return None  # allocated before debug_guards was switched on
        self.guarded.discard(block)
        end = block.requested_size
        bad = self.data.guard_check(block.ptr + end, GUARD_BYTES, GUARD_PATTERN, block.stream)
        if bad < 0:
            return None
        found = int(self.data.read(block.ptr + end + bad, 1, block.stream)[0])
        return GuardViolation(block.ptr, end, end + bad, found)

    def on_free_block(self, block: Block) -> None:
        """Poison a block as it goes back to the pool (after any other stream's use of it has completed)."""
        self.data.fill(block.ptr, block.size, POISON, block.stream)
