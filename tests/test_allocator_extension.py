"""The allocator's extension seam (minialloc.extension): hooks at fixed points of malloc and free, the public
methods extensions call, and the layering that keeps debug guards and compaction below the allocator."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Generic, Protocol

import pytest

import minialloc
from minialloc import CachingAllocator, InvalidPointerError, MiB, SimulatedGPU
from minialloc import allocator as allocator_module
from minialloc.blocks import Block
from minialloc.debug import Guards
from minialloc.extension import AllocatorExtension, AllocatorHost
from minialloc.mempool import PoolOwner
from minialloc.tables import AllocatorTables

PACKAGE = Path(minialloc.__file__).parent


class Recorder(AllocatorExtension):
    """Writes down every hook call; pads each request by `pad` bytes; refuses the frees of `refuse`."""

    def __init__(self, pad: int = 0) -> None:
        self.calls: list[tuple[str, int]] = []
        self.pad = pad
        self.refuse: set[int] = set()
        self.report: Exception | None = None

    def request_size(self, size: int) -> int:
        self.calls.append(("request_size", size))
        return size + self.pad

    def on_malloc(self, block: Block) -> None:
        self.calls.append(("on_malloc", block.requested_size))

    def check_free(self, block: Block) -> None:
        self.calls.append(("check_free", block.ptr))
        if block.ptr in self.refuse:
            raise InvalidPointerError("refused")

    def on_free(self, block: Block) -> Exception | None:
        self.calls.append(("on_free", block.ptr))
        return self.report

    def on_free_block(self, block: Block) -> None:
        self.calls.append(("on_free_block", block.ptr))


def test_hooks_run_in_order_and_the_program_keeps_its_own_size():
    a = CachingAllocator(SimulatedGPU("1GiB"), "")
    rec = a.add_extension(Recorder(pad=600))
    assert a.extensions == (rec,) and a.find_extension(Recorder) is rec
    p = a.malloc(1000)
    assert a.block_at(p).size == 2048  # 1000 + 600 rounded to 512: the rules saw the padded size
    assert a.memory_stats()["requested_bytes.all.current"] == 1000  # the statistics keep the program's
    a.free(p)
    assert rec.calls == [("request_size", 1000), ("on_malloc", 1000), ("check_free", p), ("on_free", p),
                         ("on_free_block", p)]
    a.remove_extension(rec)
    a.free(a.malloc(1000))
    assert len(rec.calls) == 5 and a.extensions == ()
    a.check_invariants()


def test_on_free_block_waits_for_other_streams():
    gpu = SimulatedGPU("1GiB")
    a = CachingAllocator(gpu, "")
    rec = a.add_extension(Recorder())
    p = a.malloc(4096)
    a.record_stream(p, 1)
    a.free(p)
    assert [c for c, _ in rec.calls][-1] == "on_free"  # pending: other stream's work is queued
    gpu.synchronize(1)
    a.process_events()
    assert rec.calls[-1] == ("on_free_block", p)


def test_a_refused_free_changes_nothing_and_a_reported_problem_comes_after_the_free():
    a = CachingAllocator(SimulatedGPU("1GiB"), "")
    rec = a.add_extension(Recorder())
    p, q = a.malloc(4096), a.malloc(4096)
    rec.refuse.add(p)
    with pytest.raises(InvalidPointerError, match="refused"):
        a.free(p)
    assert a.block_at(p).allocated and ("on_free", p) not in rec.calls
    rec.report = ValueError("found after the free")
    with pytest.raises(ValueError, match="found after the free"):
        a.free(q)
    assert a.block_at(q) is None  # the free completed first
    a.check_invariants()


def test_methods_are_never_swapped_on_the_instance():
    """A reader of CachingAllocator.malloc reads the malloc that runs, with debug guards and Buffers too."""
    a = CachingAllocator(SimulatedGPU("64MiB", store_data=True), "debug_guards:True")
    buf = a.buffer(MiB)
    assert {"malloc", "free", "_free_block", "_alloc_found_block"}.isdisjoint(vars(a))
    assert isinstance(a.find_extension(Guards), Guards) and len(a.extensions) == 2
    buf.free()
    a.set_allocator_settings("debug_guards:False")
    assert a.find_extension(Guards) is None


def test_the_allocator_is_the_seams_host():
    a = CachingAllocator(SimulatedGPU("1GiB"), "max_split_size_mb:64")
    host: AllocatorHost = a  # what compaction and extensions are typed against
    assert host.max_split_size == 64 * MiB and host.lock is a._lock
    small, large = host.pools()
    assert small.is_small and not large.is_small
    p = a.malloc(30 * MiB)
    a.free(p)
    (segment,) = [b for b in host.blocks() if not b.allocated]
    assert segment.segment_blocks() == [segment]
    host.release_segment(segment)
    assert a.memory_reserved() == 0
    with pytest.raises(ValueError, match="not a whole free segment"):
        host.release_segment(a.block_at(a.malloc(1000)))


def test_malloc_rounds_with_round_size_itself(monkeypatch):
    """Chapter 1 prints round_size as the rule minialloc runs: malloc calls that very function."""
    seen = []

    def spy(size: int, divisions: int) -> int:
        seen.append((size, divisions))
        return allocator_module.roundup_power2_next_division(size, 4) if divisions else -(-size // 512) * 512

    monkeypatch.setattr(allocator_module, "round_size", spy)
    a = CachingAllocator(SimulatedGPU("1GiB"), "")
    a.malloc(1000)
    assert seen == [(1000, 0)]


def _imports(path: Path) -> set[str]:
    """The minialloc modules a file imports, at any level (TYPE_CHECKING and function bodies included)."""
    package = path.parent.relative_to(PACKAGE.parent).parts  # ("minialloc",) or ("minialloc", "devices")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            found.add(".".join([*base, node.module or ""]).rstrip("."))
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("name", ["blocks.py", "extension.py", "debug.py", "compaction.py", "expandable.py",
                                  "expandable_blocks.py", "history.py", "snapshot_writer.py", "memory_api.py",
                                  "restore.py", "invariants.py", "mempool.py", "tables.py",
                                  "devices/base.py", "devices/data.py", "devices/simulated.py", "devices/cuda.py"])
def test_what_the_allocator_uses_never_imports_the_allocator(name):
    assert "minialloc.allocator" not in _imports(PACKAGE / name), name


def _protocol_members(protocol: type) -> set[str]:
    """The names a Protocol asks for (its annotated attributes, methods and properties, its bases' too)."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (object, Protocol, Generic):
            continue
        names.update(getattr(cls, "__annotations__", {}))
        names.update(n for n, v in vars(cls).items()
                     if not n.startswith("__") and (callable(v) or isinstance(v, property)))
    return names


@pytest.mark.parametrize("protocol", [AllocatorHost, AllocatorTables, PoolOwner])
def test_the_allocator_has_everything_its_friends_protocols_ask_for(protocol):
    """restore.py, invariants.py and mempool.py are typed through these protocols instead of importing the
    allocator: each member must be there on a real one, or they would fail only when called."""
    a = CachingAllocator(SimulatedGPU("1GiB"), "")
    members = _protocol_members(protocol)
    assert {"_incref_pool", "pools", "device"} & members, members  # the walk found the members
    missing = sorted(n for n in members if not hasattr(a, n))
    assert not missing, f"CachingAllocator lacks {missing} of {protocol.__name__}"


def test_the_import_check_sees_imports():
    assert {"minialloc.memory_api", "minialloc.debug", "minialloc.devices.base"} <= _imports(PACKAGE / "allocator.py")
    assert {"minialloc.sizes", "minialloc.devices.base"} <= _imports(PACKAGE / "devices" / "cuda.py")
