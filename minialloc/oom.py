"""The out-of-memory error: PyTorch 2.13's message word for word, then minialloc's two figures on a line of their own.

PyTorch's message (DeviceCachingAllocator::malloc in c10/cuda/CUDACachingAllocator.cpp) reads:

    CUDA out of memory. Tried to allocate {alloc_size}. GPU {d} has a total capacity of {total} of which
    {device_free} is free. {per-process lines}{allowed} allowed; Of the allocated memory {allocated} is allocated
    by PyTorch, and {reserved - allocated} is reserved by PyTorch but unallocated. If reserved but unallocated
    memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See
    documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)

(one line; the double spaces are PyTorch's). "Tried to allocate" is the SEGMENT size the allocator asked the device
for, not the request: a 3 MiB tensor reports 20.00 MiB. "{allowed} allowed; " appears only while a memory fraction
under 1.0 is set. The per-process lines ("Including non-PyTorch memory, this process has X memory in use. " and
"Process N has X memory in use. " for the others) come from NVML (reportProcessMemoryInfo): a device that offers no
such list, the simulated GPU among them, prints none, as PyTorch does without NVML. The expandable-segments hint is
printed on every OOM, even when expandable segments are already on, exactly as PyTorch prints it. minialloc's
memory is "PyTorch" memory in this text, so that the message can be compared with a real one character for
character.

Then, on a new line that says whose it is, minialloc adds what PyTorch leaves out: the largest free block and a
fragmentation figure, 1 - largest free / total free (the ratio TensorFlow's BFC allocator and RMM's arena report;
asked for in pytorch#29554).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .lang import messages, say
from .sizes import pytorch_format_size as format_size  # PyTorch's message: English, byte for byte

# minialloc's own line under PyTorch's message; PyTorch's text itself is never translated
TEXT = messages("minialloc.oom.TEXT", {
    "minialloc_line": "minialloc: the largest free block is {largest} of {free} free in all (fragmentation "
                      "{fragmentation}).",
})

# PyTorch 2.13's hint, word for word (with its two double spaces).
EXPANDABLE_HINT = (
    " If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to"
    " avoid fragmentation.  See documentation for Memory Management "
    " (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)
MORE_THAN_1EB = "CUDA out of memory. Tried to allocate more than 1EB memory."  # NativeCachingAllocator::allocate


@dataclass(frozen=True)
class OOMReport:
    """Every number of the message, as the allocator saw it at the moment of failure."""

    requested_size: int  # what the caller asked for
    alloc_size: int  # the segment size asked of the device: "Tried to allocate"
    device_index: int
    total_capacity: int
    device_free: int
    allowed: int | None  # set_per_process_memory_fraction's limit, if a fraction under 1.0 is set
    allocated: int
    reserved: int
    largest_free_block: int  # the largest block a request could get without new pages: cached or device
    expandable_segments: bool
    # reportProcessMemoryInfo's sentences, each ending in ". " ("" without NVML, as on the simulated GPU)
    process_info: str = ""

    @property
    def process_in_use(self) -> int:
        """What the device says is in use (all of it is minialloc's on the simulator): derived, not stored."""
        return self.total_capacity - self.device_free

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

    def pytorch_message(self) -> str:
        """The text PyTorch 2.13 would print for these numbers (one line)."""
        allowed = f"{format_size(self.allowed)} allowed; " if self.allowed is not None else ""
        return (
            f"CUDA out of memory. Tried to allocate {format_size(self.alloc_size)}. "
            f"GPU {self.device_index} has a total capacity of {format_size(self.total_capacity)} "
            f"of which {format_size(self.device_free)} is free. {self.process_info}{allowed}"
            f"Of the allocated memory {format_size(self.allocated)} is allocated by PyTorch, and "
            f"{format_size(self.reserved_unallocated)} is reserved by PyTorch but unallocated.{EXPANDABLE_HINT}"
        )

    def minialloc_line(self) -> str:
        """minialloc's addition, on its own line: in the notebook's language (PyTorch's part stays English)."""
        return say(TEXT, "minialloc_line", largest=format_size(self.largest_free_block),
                   free=format_size(self.total_free), fragmentation=f"{self.fragmentation:.2f}")

    def message(self) -> str:
        return f"{self.pytorch_message()}\n{self.minialloc_line()}"


class OutOfMemoryError(MemoryError):
    """Raised by CachingAllocator.malloc when no block can be found or made; `.report` holds every figure.

    A request of 1 EB or more is refused before the allocator looks at anything: its error has no report."""

    def __init__(self, report: OOMReport | None, message: str | None = None) -> None:
        super().__init__(report.message() if report is not None else message or MORE_THAN_1EB)
        self.report = report

    @classmethod
    def more_than_1eb(cls) -> OutOfMemoryError:
        return cls(None, MORE_THAN_1EB)


def process_info(device: Any) -> str:
    """reportProcessMemoryInfo: one sentence per process using the device, from a device that can list them
    (NVML on a real GPU: device.process_memory_info() -> [(pid, bytes)]); "" otherwise, as without NVML."""
    lister = getattr(device, "process_memory_info", None)
    if lister is None:
        return ""
    me = os.getpid()
    return "".join(
        ("Including non-PyTorch memory, this process" if pid == me else f"Process {pid}")
        + f" has {format_size(used)} memory in use. "
        for pid, used in lister()
    )
