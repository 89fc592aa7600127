"""minialloc: PyTorch 2.13's CUDA caching allocator, rule for rule, on a simulated GPU (or a real one).

The version mirrored is PyTorch 2.13 (torch 2.13.0): its allocator rules, PYTORCH_CUDA_ALLOC_CONF keys and errors,
memory_stats(), memory_summary(), snapshot schema, OOM message and history switch (off until
record_memory_history()). The README lists the deliberate differences (the OOM message's extra line, debug
guards, compaction, empty_cache annotations, state restore, stricter config strings).

    >>> import minialloc
    >>> gpu = minialloc.SimulatedGPU("8GiB")
    >>> alloc = minialloc.CachingAllocator(gpu)
    >>> p = alloc.malloc(3 * 2**20)          # 3 MiB: a 20 MiB segment, split
    >>> minialloc.format_size(alloc.memory_reserved())
    '20.00 MiB'
    >>> alloc.free(p)
"""

from .allocator import CachingAllocator, InvalidPointerError
from .backends import default_device
from .compaction import Buffer, DefragmentReport
from .config import AllocatorConfig, ConfigError
from .cuda_device import CudaGPU, NoCudaGPU
from .debug import GuardViolation
from .device import DataGPU, DeviceError, DeviceOutOfMemory, SimulatedGPU
from .oom import OOMReport, OutOfMemoryError
from .paging import BlockManager, HostPool, KVCache, KVSpec, OutOfBlocksError, PagingError
from .sizes import GiB, KiB, MiB, format_size, parse_size
from .snapshot import SnapshotError, dump_snapshot, load_snapshot
from .summary import memory_summary

__all__ = [
    "AllocatorConfig",
    "BlockManager",
    "Buffer",
    "CachingAllocator",
    "ConfigError",
    "CudaGPU",
    "DataGPU",
    "DefragmentReport",
    "DeviceError",
    "DeviceOutOfMemory",
    "GiB",
    "GuardViolation",
    "HostPool",
    "InvalidPointerError",
    "KVCache",
    "KVSpec",
    "KiB",
    "MiB",
    "NoCudaGPU",
    "OOMReport",
    "OutOfBlocksError",
    "OutOfMemoryError",
    "PagingError",
    "SimulatedGPU",
    "SnapshotError",
    "default_device",
    "dump_snapshot",
    "format_size",
    "load_snapshot",
    "memory_summary",
    "parse_size",
]
