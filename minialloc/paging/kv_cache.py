"""The paged KV storage: one array of [num_blocks, 2, block_size, heads, head_dim] per layer, allocated once.

The bytes come from minialloc's CachingAllocator (accounting), with optional data: a NumPy array for the reference
kernels (minialloc.kernels.reference), or an array where a minialloc.kernels runner works (CuPy on a real GPU),
moved by the copy_blocks kernel (copy-on-write) and by device gathers and transfers (swap).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..kernels.reference import copy_blocks_reference, copy_waves, paged_attention_reference
from .block_manager import DEFAULT_BLOCK_SIZE

if TYPE_CHECKING:
    from ..allocator import CachingAllocator
    from ..kernels.launch import Kernels


@dataclass(frozen=True)
class KVSpec:
    """Shape of a model's KV cache: per token and layer, a key and a value of num_kv_heads x head_dim."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # fp16

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) x layers x hidden x bytes; OPT-13B: 2 x 40 x 5120 x 2 = 800 KiB (paper section 3)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


class KVCache:
    """The paged KV storage: [num_blocks, 2, block_size, heads, head_dim] per layer, allocated once up front.

    The bytes come from a minialloc CachingAllocator in one malloc (accounting), as vLLM allocates its KV tensors
    once at start-up, sized by profiling. `with_data=True` adds the data, shape [num_layers, num_blocks, 2,
    block_size, heads, head_dim], float32: a NumPy array (small configurations, the reference kernels), or with
    `kernels` (a minialloc.kernels runner) an array where those kernels run: CuPy memory with CupyKernels on a
    real GPU, NumPy with EmulatedKernels. The methods below apply the block manager's lists to the data:
    copy-on-write with the copy_blocks kernel (NumPy twin without kernels), swap with gathers and one transfer
    each way, attention with the paged_attention kernel (NumPy twin without kernels).
    """

    MAX_HOST_BYTES = 1 << 30  # host data is for small configurations: refuse to fill the host's memory

    def __init__(self, allocator: CachingAllocator, spec: KVSpec, num_blocks: int,
                 block_size: int = DEFAULT_BLOCK_SIZE, with_data: bool = False, kernels: Kernels | None = None) -> None:
        self.spec, self.num_blocks, self.block_size = spec, num_blocks, block_size
        self.block_bytes = spec.bytes_per_token * block_size
        self.nbytes = self.block_bytes * num_blocks
        self.allocator = allocator
        self.kernels = kernels
        self.xp: Any = np if kernels is None else kernels.xp
        self.ptr = allocator.malloc(self.nbytes)
        self.shape = (spec.num_layers, num_blocks, 2, block_size, spec.num_kv_heads, spec.head_dim)
        data_bytes = 4 * int(np.prod(self.shape))
        if with_data and self.xp is np and data_bytes > self.MAX_HOST_BYTES:
            allocator.free(self.ptr)
            raise ValueError(f"with_data needs {data_bytes} bytes of host memory; use a smaller config")
        self.data = self.xp.zeros(self.shape, dtype=self.xp.float32) if with_data else None

    @classmethod
    def from_budget(cls, allocator: CachingAllocator, spec: KVSpec, budget_bytes: int,
                    block_size: int = DEFAULT_BLOCK_SIZE, with_data: bool = False,
                    kernels: Kernels | None = None) -> KVCache:
        """As many blocks as fit in `budget_bytes` (vLLM: free memory after profiling // block bytes)."""
        return cls(allocator, spec, budget_bytes // (spec.bytes_per_token * block_size), block_size, with_data,
                   kernels)

    def release(self) -> None:
        self.allocator.free(self.ptr)
        self.ptr = 0

    def layer(self, i: int) -> Any:
        return self._data()[i]

    def _data(self) -> Any:
        if self.data is None:
            raise ValueError("this KVCache has no data: create it with with_data=True")
        return self.data

    def copy_blocks(self, pairs: Iterable[tuple[int, int]]) -> int:
        """Apply copy-on-write pairs, in the order the block manager recorded them, to every layer.

        With kernels: the copy_blocks kernel over the cache seen as [num_layers * num_blocks, block bytes], one
        launch per wave of copy_waves (pairs that may run in parallel), each pair expanded to every layer. Without:
        copy_blocks_reference per layer. Returns the number of kernel launches (0 without kernels).
        """
        data, pairs = self._data(), list(pairs)
        if self.kernels is None:
            for layer in data:
                copy_blocks_reference(layer, pairs)
            return 0
        rows = data.reshape(self.spec.num_layers * self.num_blocks, -1).view(self.xp.uint8)
        waves = copy_waves(pairs)
        for wave in waves:
            self.kernels.copy_blocks(rows, [(src + i * self.num_blocks, dst + i * self.num_blocks)
                                            for i in range(self.spec.num_layers) for src, dst in wave])
        return len(waves)

    def new_host_store(self, num_blocks: int) -> np.ndarray:
        """Host memory for a HostPool of `num_blocks` blocks (pinned when the data lives on a GPU, so the
        transfers are DMA)."""
        shape = (self.spec.num_layers, num_blocks, *self.shape[2:])
        if self.xp is np:
            return np.zeros(shape, dtype=np.float32)
        import cupyx

        host = cupyx.empty_pinned(shape, dtype=np.float32)
        host[...] = 0
        return host

    def swap_out(self, pairs: Iterable[tuple[int, int]], host: np.ndarray) -> None:
        """Copy (gpu_block, cpu_block) pairs (HostPool.swap_out's) to the host store, every layer: one gather on
        the device, one transfer. Call before the GPU blocks are reused."""
        data, pairs = self._data(), list(pairs)
        if not pairs:
            return
        gpu, cpu = (np.array(side, dtype=np.int64) for side in zip(*pairs, strict=True))
        staged = data[:, self.xp.asarray(gpu)]
        host[:, cpu] = staged if self.kernels is None else self.kernels.to_host(staged)

    def swap_in(self, pairs: Iterable[tuple[int, int]], host: np.ndarray) -> None:
        """Copy (cpu_block, gpu_block) pairs (HostPool.swap_in's) back: one transfer, one scatter on the device."""
        data, pairs = self._data(), list(pairs)
        if not pairs:
            return
        cpu, gpu = (np.array(side, dtype=np.int64) for side in zip(*pairs, strict=True))
        staged = host[:, cpu]
        data[:, self.xp.asarray(gpu)] = staged if self.kernels is None else self.kernels.to_device(staged)

    def attention(self, layer: int, q: Any, block_tables: Any, context_lens: Sequence[int], scale: float) -> Any:
        """Decode attention of one layer through the block tables: the paged_attention kernel with kernels
        (q where they run), paged_attention_reference without."""
        if self.kernels is None:  # the float64 twin, returned in q's dtype as the kernel returns it
            out = paged_attention_reference(q, self.layer(layer), np.asarray(block_tables), context_lens, scale)
            return out.astype(q.dtype)
        return self.kernels.paged_attention(q, self.layer(layer), block_tables, context_lens, scale)
