"""The out-of-memory error, worded as PyTorch words it, plus the two figures PyTorch leaves out.

PyTorch's message (DeviceCachingAllocator::malloc in CUDACachingAllocator.cpp) reads:

    CUDA out of memory. Tried to allocate {alloc_size}. GPU {d} has a total capacity of {total} of which
    {device_free} is free. [Including non-PyTorch memory, this process has {in_use} memory in use. ]
    [{allowed} allowed; ]Of the allocated memory {allocated} is allocated by PyTorch, and
    {reserved - allocated} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large
    try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.

"Tried to allocate" is the SEGMENT size the allocator asked the device for, not the request: a 3 MiB tensor
reports 20.00 MiB. minialloc prints the same fields in the same format, says "minialloc" where PyTorch says
"PyTorch", and adds the largest free block and a fragmentation figure, 1 - largest free / total free (the ratio
TensorFlow's BFC allocator and RMM's arena report; asked for in pytorch#29554). The expandable-segments hint is
printed only when it would help (PyTorch prints it even when the option is already on, pytorch#173049).
"""

from __future__ import annotations

from dataclasses import dataclass

from .sizes import format_size


@dataclass(frozen=True)
class OOMReport:
    """Every number of the message, as the allocator saw it at the moment of failure."""

    requested_size: int  # what the caller asked for
    alloc_size: int  # the segment size asked of the device: "Tried to allocate"
    device_index: int
    total_capacity: int
    device_free: int
    process_in_use: int  # what the device says this process holds (all of it is minialloc's on the simulator)
    allowed: int | None  # set_per_process_memory_fraction's limit, if any
    allocated: int
    reserved: int
    largest_free_block: int  # the largest block a request could get without new pages: cached or device
    expandable_segments: bool

    @property
    def reserved_unallocated(self) -> int:
        return self.reserved - self.allocated

    @property
    def total_free(self) -> int:
        """Free memory in all its pieces: the device's free pages plus the cache's free blocks."""
        free = self.device_free if self.allowed is None else min(self.device_free, self.allowed - self.reserved)
        return max(free, 0) + self.reserved_unallocated

    @property
    def fragmentation(self) -> float:
        """1 - largest free / total free: 0 when all free memory is one piece, near 1 when it is dust."""
        return 0.0 if self.total_free == 0 else 1.0 - self.largest_free_block / self.total_free

    @property
    def expandable_would_help(self) -> bool:
        """Expandable segments can reuse every wholly free page, so they help when the pieces add up."""
        return not self.expandable_segments and self.total_free >= self.alloc_size > self.largest_free_block

    def message(self) -> str:
        parts = [
            f"CUDA out of memory. Tried to allocate {format_size(self.alloc_size)}. "
            f"GPU {self.device_index} has a total capacity of {format_size(self.total_capacity)} "
            f"of which {format_size(self.device_free)} is free. "
            f"Including non-minialloc memory, this process has {format_size(self.process_in_use)} memory in use. "
        ]
        if self.allowed is not None:
            parts.append(f"{format_size(self.allowed)} allowed; ")
        parts.append(
            f"Of the allocated memory {format_size(self.allocated)} is allocated by minialloc, and "
            f"{format_size(self.reserved_unallocated)} is reserved by minialloc but unallocated."
        )
        parts.append(
            f" The largest free block is {format_size(self.largest_free_block)} of "
            f"{format_size(self.total_free)} free in all (fragmentation {self.fragmentation:.2f})."
        )
        if self.expandable_would_help:
            parts.append(
                " If reserved but unallocated memory is large try setting"
                " MINIALLOC_ALLOC_CONF=expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF in PyTorch)"
                " to avoid fragmentation.  See documentation for Memory Management"
                "  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
            )
        return "".join(parts)


class OutOfMemoryError(MemoryError):
    """Raised by CachingAllocator.malloc when no block can be found or made; `.report` holds every figure."""

    def __init__(self, report: OOMReport) -> None:
        super().__init__(report.message())
        self.report = report
