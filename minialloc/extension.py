"""The allocator's extension seam: what minialloc's own additions to PyTorch's rules (debug guards in debug.py,
movable Buffers in compaction.py) may hook into and call, so that they never reach into the allocator's insides
and the allocator never swaps its methods for theirs.

Two halves:
- AllocatorExtension: hooks the allocator calls, under its lock, at fixed points of malloc and free. Install one
  with `allocator.add_extension(ext)`. With no extension installed malloc and free test one empty tuple and run
  no hook at all, so the default path costs what it did.
- AllocatorHost: the allocator's methods an extension (or compaction) may call: find and list blocks, move a live
  block, give back a whole free segment. ExtensionHost implements them and CachingAllocator inherits it; this
  module does not import the allocator, so an extension depends on this seam only, and the allocator may import
  its extensions without an import circle.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .blocks import Block, BlockPool
    from .history import History
    from .stats import DeviceStats


class AllocatorExtension:
    """Hooks into malloc and free; every default does nothing. Each runs under the allocator's lock.

    The order on one malloc: request_size (before rounding), then the allocator's rules, then on_malloc. On one
    free: check_free (may refuse), on_free (the free happens), and on_free_block when the block goes back to its
    pool (at once, or once other streams' uses have completed after record_stream)."""

    def request_size(self, size: int) -> int:
        """The bytes to ask the rules for when the program asks for `size` (e.g. room for a guard after it).
        The block's requested_size, the statistics and the trace keep the program's own size."""
        return size

    def on_malloc(self, block: Block) -> None:
        """`block` has just been handed out; block.requested_size is what the program asked for."""

    def check_free(self, block: Block) -> None:
        """Raise (InvalidPointerError) to refuse free() of this live block; must change nothing."""

    def on_free(self, block: Block) -> Exception | None:
        """The program frees `block`; an exception returned here is raised once the free has completed (so the
        allocator stays consistent whatever the extension found)."""
        return None

    def on_free_block(self, block: Block) -> None:
        """`block` goes back to its pool: its bytes are nobody's from now on."""


E = TypeVar("E", bound=AllocatorExtension)


class AllocatorHost(Protocol):
    """What CachingAllocator offers its extensions and compaction (besides malloc and free)."""

    device: Any
    stats: DeviceStats

    @property
    def lock(self) -> threading.RLock: ...

    @property
    def extensions(self) -> tuple[AllocatorExtension, ...]: ...

    @property
    def max_split_size(self) -> int: ...

    def malloc(self, size: int, stream: int = 0) -> int: ...

    def free(self, ptr: int) -> None: ...

    def add_extension(self, extension: E) -> E: ...

    def find_extension(self, kind: type[E]) -> E | None: ...

    def block_at(self, ptr: int) -> Block | None: ...

    def blocks(self) -> Iterator[Block]: ...

    def pools(self) -> tuple[BlockPool, BlockPool]: ...

    def move_block(self, block: Block, dst: int) -> None: ...

    def release_segment(self, block: Block) -> None: ...

    def process_events(self) -> None: ...

    def largest_free_block(self) -> int: ...

    def get_memory_metadata(self) -> str: ...

    def set_memory_metadata(self, metadata: str) -> None: ...


class ExtensionHost:
    """AllocatorHost's methods, and installing extensions, over the allocator's tables. CachingAllocator
    (allocator.py) inherits this; the attributes it uses are set by CachingAllocator.__init__."""

    _lock: threading.RLock
    _extensions: tuple[AllocatorExtension, ...]
    _max_split: int
    _active: dict[int, Block]
    _small: BlockPool
    _large: BlockPool
    _history: History | None

    if TYPE_CHECKING:  # the policy's methods these use (allocator.py)
        def _all_blocks(self) -> Iterator[Block]: ...

        def _release_block(self, block: Block) -> None: ...

    @property
    def extensions(self) -> tuple[AllocatorExtension, ...]:
        """The installed extensions, in the order their hooks run."""
        return self._extensions

    def add_extension(self, extension: E) -> E:
        """Install an extension: its hooks run from the next malloc or free on. Returns it."""
        with self._lock:
            self._extensions = (*self._extensions, extension)
        return extension

    def remove_extension(self, extension: AllocatorExtension) -> None:
        with self._lock:
            self._extensions = tuple(e for e in self._extensions if e is not extension)

    def find_extension(self, kind: type[E]) -> E | None:
        """The installed extension of this class (e.g. debug.Guards), or None."""
        for e in self._extensions:
            if isinstance(e, kind):
                return e
        return None

    @property
    def lock(self) -> threading.RLock:
        """The allocator's re-entrant lock: hold it to keep blocks from moving between two calls."""
        return self._lock

    @property
    def max_split_size(self) -> int:
        """max_split_size in bytes (2**64 - 1 when unset): blocks at least this big are "oversize"."""
        return self._max_split

    def block_at(self, ptr: int) -> Block | None:
        """The live block (allocated, or freed and waiting on other streams' events) that starts at ptr."""
        return self._active.get(ptr)

    def blocks(self) -> Iterator[Block]:
        """Every mapped block: the free ones in the pools, then the active ones (get_all_blocks)."""
        return self._all_blocks()

    def pools(self) -> tuple[BlockPool, BlockPool]:
        """(small pool, large pool)."""
        return self._small, self._large

    def move_block(self, block: Block, dst: int) -> None:
        """Re-key a live block whose bytes the caller has copied to dst (compaction); the Block object, and so
        anything holding it, stays the same. The caller fixes its neighbours. PyTorch's trace has no "move": a
        free and an alloc keep replays and timelines right."""
        with self._lock:
            src = block.ptr
            history = self._history
            if history is not None:
                history.record("free_requested", src, block.requested_size, block.stream, block.frames)
                history.record("free_completed", src, block.requested_size, block.stream, block.frames)
                history.record("alloc", dst, block.requested_size, block.stream, block.frames)
            del self._active[src]
            block.ptr = dst
            self._active[dst] = block

    def release_segment(self, block: Block) -> None:
        """Give a wholly free ordinary segment, one free block in its pool, back to the device (release_block)."""
        with self._lock:
            if block.allocated or block.is_split() or block.segment is not None or block.key not in block.pool.blocks:
                raise ValueError(f"{block!r} is not a whole free segment in its pool")
            self._release_block(block)
