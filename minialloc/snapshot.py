"""Read and write memory snapshots in PyTorch's format, so PyTorch's tools open minialloc's and back.

A snapshot is what ``torch.cuda.memory._snapshot()`` returns and ``torch.cuda.memory._dump_snapshot(path)``
pickles: plain dicts, lists, tuples, strings and numbers, no class. PyTorch builds it in C++
(THCPModule_memorySnapshot in torch/csrc/cuda/Module.cpp, from the SegmentInfo, BlockInfo and TraceEntry
structs of c10/cuda/CUDACachingAllocator.h). In plain words:

``segments``: one dict per segment, a piece of device memory the allocator holds (one cudaMalloc, or the
mapped part of an expandable segment). Keys: ``device``, ``address``, ``total_size``, ``allocated_size``
(bytes in allocated blocks), ``active_size`` (allocated or waiting to be freed), ``requested_size`` (what
callers asked for, before rounding), ``stream``, ``segment_type`` ('small' or 'large': the pool),
``segment_pool_id`` (a pair of ints, (0, 0) unless a private pool such as a CUDA graph's owns it),
``is_expandable``, ``frames`` (the stack that made the segment) and ``blocks``.

``blocks``: the segment cut into consecutive pieces, in address order; their sizes add up to ``total_size``.
Keys: ``address``, ``size``, ``requested_size``, ``frames`` and ``state``: 'active_allocated' (a tensor holds
it), 'active_pending_free' (freed, but another stream may still use it) or 'inactive' (free in the cache).

``device_traces``: one list per device of the allocator's recent actions, oldest first, kept only while
``torch.cuda.memory._record_memory_history()`` is on. Keys: ``action`` (alloc, free_requested,
free_completed, segment_alloc, segment_free, segment_map, segment_unmap, snapshot, oom), ``addr`` (for an
'oom', ``device_free`` instead: the bytes CUDA still reported free), ``size``, ``stream``, ``time_us``,
``compile_context``, ``user_metadata``, and ``frames`` when stacks were recorded. Older snapshots have no
``device_traces``; it then reads as [].

``frames``: lists of {``filename``, ``line``, ``name``}, innermost call first.

``allocator_settings``: the configuration in force (``PYTORCH_CUDA_ALLOC_CONF``, ``max_split_size``,
``garbage_collection_threshold``, ``expandable_segments``, ``roundup_power2_divisions``, ...).
``external_annotations``: record_function events, each a dict with ``device`` and ``time_us``, and for
record_function's the ``name`` and ``stage`` ('START' or 'END'). minialloc writes a START/END pair named
``empty_cache`` around each empty_cache() call while it records history: the releases between them are the call's.

Only what a reader needs is required; the other keys are type-checked when present, and keys not named
here are kept as they are, so snapshots from older or newer PyTorch versions still load.
"""

from __future__ import annotations

import os
import pickle
import reprlib
import secrets
from typing import Any

__all__ = ["BLOCK_STATES", "SEGMENT_TYPES", "TRACE_ACTIONS", "SnapshotError", "dump_snapshot",
           "load_snapshot", "upgrade_snapshot", "validate_snapshot"]

BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
SEGMENT_TYPES = ("small", "large")
# TraceEntry::Action in c10/core/CachingDeviceAllocator.h, spelled as the snapshot spells them.
TRACE_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                 "segment_unmap", "snapshot", "oom")

_PLAIN_TYPES = (dict, list, tuple, str, bytes, int, float, bool, type(None))
_ADVICE = "Write snapshots with torch.cuda.memory._dump_snapshot() or minialloc.snapshot.dump_snapshot()."

Types = type | tuple[type, ...]
Fields = dict[str, tuple[Types, bool]]  # key -> (allowed types, required?)

_SEGMENT: Fields = {
    "address": (int, True), "total_size": (int, True), "stream": (int, True), "blocks": (list, True),
    "device": (int, False), "allocated_size": (int, False), "active_size": (int, False),
    "requested_size": (int, False), "segment_type": (str, False), "segment_pool_id": ((tuple, list), False),
    "is_expandable": (bool, False), "frames": (list, False),
}
_BLOCK: Fields = {
    "size": (int, True), "state": (str, True),
    "address": (int, False), "requested_size": (int, False), "frames": (list, False),
}
_TRACE_ENTRY: Fields = {
    "action": (str, True), "size": (int, True),
    "stream": (int, False), "time_us": (int, False), "frames": (list, False),
    "compile_context": (str, False), "user_metadata": (str, False),
}
_FRAME: Fields = {"filename": (str, True), "line": (int, True), "name": (str, True)}
_SETTINGS: Fields = {
    "PYTORCH_CUDA_ALLOC_CONF": (str, False), "max_split_size": (int, False),
    "garbage_collection_threshold": ((float, int), False), "expandable_segments": (bool, False),
    "pinned_num_register_threads": (int, False), "release_lock_on_cudamalloc": (bool, False),
    "pinned_use_cuda_host_register": (bool, False), "graph_capture_record_stream_reuse": (bool, False),
    "roundup_power2_divisions": (dict, False),
}
_ANNOTATION: Fields = {"device": (int, False), "time_us": (int, False), "name": (str, False),
                       "stage": (str, False)}


class SnapshotError(ValueError):
    """A snapshot that cannot be read or does not follow the schema.

    The message gives the file (``source``), the place in the structure (``where``, such as
    "segments[3].blocks[1]"), the ``problem`` and the ``advice``; each is also kept as an attribute.
    """

    def __init__(self, problem: str, *, source: str | None = None, where: str = "", advice: str = _ADVICE):
        self.problem, self.source, self.where, self.advice = problem, source, where, advice
        place = [p for p in (source, where or "top level") if p]
        super().__init__(f"{': '.join(place)}: {problem}. {advice}")


class _GlobalRefused(pickle.UnpicklingError):
    pass


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that refuses every global, so no class or function named in the file is ever called."""

    def find_class(self, module: str, name: str) -> Any:
        raise _GlobalRefused(f"{module}.{name}")


def load_snapshot(path: str | os.PathLike[str], segment_list: bool = False) -> dict[str, Any]:
    """Read and validate a snapshot pickled by torch.cuda.memory._dump_snapshot() or by dump_snapshot().

    Snapshot files are pickles, and a normal unpickler runs whatever code the file names: never
    pickle.load() a file you did not write. This one uses a restricted unpickler that refuses every class
    and function, so only dicts, lists, tuples, strings, bytes, numbers, booleans and None can come out,
    and nothing in the file runs. A missing "device_traces" (older snapshots) is filled in as [].
    segment_list: also accept the segments-only list torch.cuda.memory_snapshot() returns, read as
    {"segments": the_list} (a state with no trace).

    Raises SnapshotError for an empty, truncated or non-pickle file, one that needs a class, or one that
    breaks the schema; OSError if the file cannot be opened.
    """
    source = os.fspath(path)
    with open(path, "rb") as f:
        try:
            snap = _PlainUnpickler(f).load()
        except _GlobalRefused as e:
            raise SnapshotError(
                f"the pickle asks for {e}, and a memory snapshot needs no class or function",
                source=source, where="pickle stream",
                advice="Loading stopped there, so nothing from the file ran. This is not a snapshot: "
                "do not open it with pickle.load() unless you trust whoever wrote it.",
            ) from None
        except Exception as e:  # on bad input the unpickler raises many types; all mean "unreadable"
            empty = os.fstat(f.fileno()).st_size == 0
            raise SnapshotError(
                "the file is empty" if empty else f"not a readable pickle ({type(e).__name__}: {e})",
                source=source, where="pickle stream",
                advice="The file may be cut short (an interrupted write or copy) or not be a snapshot "
                "at all. " + _ADVICE,
            ) from e
    if segment_list and isinstance(snap, list):
        snap = {"segments": snap}
    validate_snapshot(snap, source)
    snap.setdefault("device_traces", [])
    return snap


def upgrade_snapshot(snap: dict[str, Any]) -> dict[str, Any]:
    """The snapshot in the block layout PyTorch 2.1 and later write, without changing `snap`.

    PyTorch 2.0 wrote a block as {size, requested_size, state, history: [{addr, real_size, frames}]}: no
    ``address`` (a block starts where the one before it in its segment ends) and no ``frames`` (the stack of its
    latest allocation is the last history entry's). _memory_viz's _block_extra_legacy reads them the same way."""
    segments = []
    for seg in snap["segments"]:
        address, blocks, changed = seg["address"], [], False
        for block in seg["blocks"]:
            history = block.get("history") or [{}]
            if "address" not in block or ("frames" not in block and "history" in block):
                block = dict(block)
                block.setdefault("address", address)
                live = block["state"] != "inactive"  # a free block's history is of a tensor that is gone
                block.setdefault("frames", list(history[-1].get("frames", [])) if live else [])
                block.setdefault("requested_size", history[-1].get("real_size", block["size"]) if live else 0)
                changed = True
            blocks.append(block)
            address += block["size"]
        segments.append(dict(seg, blocks=blocks) if changed else seg)
    return dict(snap, segments=segments)


def validate_snapshot(snap: Any, source: str = "<snapshot>") -> None:
    """Check that snap follows the snapshot schema (see the module docstring); raise SnapshotError if not."""
    _check_plain(snap, source)
    if isinstance(snap, list):
        raise SnapshotError(
            "got a list, not a dict", source=source,
            advice="This looks like the segments-only list torch.cuda.memory_snapshot() returns. Save "
            "torch.cuda.memory._snapshot() instead, or wrap the list as {'segments': the_list}.",
        )
    if not isinstance(snap, dict):
        raise SnapshotError(f"expected a dict, got {_describe(snap)}", source=source)
    if "segments" not in snap:
        raise SnapshotError("missing key 'segments'", source=source)

    for i, segment in enumerate(_check_list(snap["segments"], "segments", source)):
        where = f"segments[{i}]"
        _check_dict(segment, _SEGMENT, where, source)
        _check_choice(segment, "segment_type", SEGMENT_TYPES, where, source)
        pool_id = segment.get("segment_pool_id", (0, 0))
        if len(pool_id) != 2 or not all(_type_ok(x, int) for x in pool_id):
            raise SnapshotError(f"expected a pair of ints, got {_describe(pool_id)}", source=source,
                                where=f"{where}.segment_pool_id")
        _check_frames(segment, where, source)
        for j, block in enumerate(segment["blocks"]):
            _check_dict(block, _BLOCK, f"{where}.blocks[{j}]", source)
            _check_choice(block, "state", BLOCK_STATES, f"{where}.blocks[{j}]", source)
            _check_frames(block, f"{where}.blocks[{j}]", source)
        covered = sum(block["size"] for block in segment["blocks"])
        if covered != segment["total_size"]:
            raise SnapshotError(f"the blocks add up to {covered} bytes, total_size says "
                                f"{segment['total_size']}", source=source, where=where)

    for d, trace in enumerate(_check_list(snap.get("device_traces", []), "device_traces", source)):
        for k, entry in enumerate(_check_list(trace, f"device_traces[{d}]", source)):
            where = f"device_traces[{d}][{k}]"
            _check_dict(entry, _TRACE_ENTRY, where, source)
            _check_choice(entry, "action", TRACE_ACTIONS, where, source)
            # An 'oom' entry holds the bytes CUDA reported free where the others hold an address (PyTorch 2.0
            # wrote them as 'addr' too).
            address_key = "device_free" if entry["action"] == "oom" and "addr" not in entry else "addr"
            _check_dict(entry, {address_key: (int, True)}, where, source)
            _check_frames(entry, where, source)

    if "allocator_settings" in snap:
        _check_dict(snap["allocator_settings"], _SETTINGS, "allocator_settings", source)
    annotations = _check_list(snap.get("external_annotations", []), "external_annotations", source)
    for i, annotation in enumerate(annotations):
        _check_dict(annotation, _ANNOTATION, f"external_annotations[{i}]", source)


def dump_snapshot(snapshot_or_allocator: Any, path: str | os.PathLike[str]) -> None:
    """Validate a snapshot and pickle it to path, as torch.cuda.memory._dump_snapshot() does (pickle.dump).

    snapshot_or_allocator is a snapshot dict, or an object whose .snapshot() returns one (an allocator).
    The pickle goes to a temporary file beside path, which is then renamed over path: an invalid snapshot
    or a failed write leaves any file already at path as it was.
    """
    snap = snapshot_or_allocator
    if not isinstance(snap, dict):
        if not callable(getattr(snap, "snapshot", None)):
            raise TypeError(f"expected a snapshot dict or an object with a .snapshot() method, "
                            f"got {_describe(snap)}")
        snap = snap.snapshot()
    target = os.fspath(path)
    validate_snapshot(snap, f"snapshot for {target}")
    tmp = f"{target}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "xb") as f:
            pickle.dump(snap, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {reprlib.repr(value)}"


def _type_ok(value: Any, types: Types) -> bool:
    allowed = types if isinstance(types, tuple) else (types,)
    # bool is a subclass of int, but True is no address.
    return isinstance(value, allowed) and (bool in allowed or not isinstance(value, bool))


def _check_list(value: Any, where: str, source: str) -> list[Any]:
    if not isinstance(value, list):
        raise SnapshotError(f"expected a list, got {_describe(value)}", source=source, where=where)
    return value


def _check_dict(value: Any, fields: Fields, where: str, source: str) -> None:
    if not isinstance(value, dict):
        raise SnapshotError(f"expected a dict, got {_describe(value)}", source=source, where=where)
    for key, (types, required) in fields.items():
        if key not in value:
            if required:
                raise SnapshotError(f"missing key {key!r}", source=source, where=where)
        elif not _type_ok(value[key], types):
            names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
            raise SnapshotError(f"expected {names}, got {_describe(value[key])}", source=source,
                                where=f"{where}.{key}")


def _check_choice(value: dict[str, Any], key: str, choices: tuple[str, ...], where: str, source: str) -> None:
    if key in value and value[key] not in choices:
        raise SnapshotError(f"unknown {key} {value[key]!r}; PyTorch writes one of {', '.join(choices)}",
                            source=source, where=f"{where}.{key}")


def _check_frames(value: dict[str, Any], where: str, source: str) -> None:
    for i, frame in enumerate(value.get("frames", [])):
        _check_dict(frame, _FRAME, f"{where}.frames[{i}]", source)


def _check_plain(snap: Any, source: str) -> None:
    """Refuse any value but plain containers and scalars: load_snapshot could not read it back."""
    stack: list[tuple[Any, str]] = [(snap, "")]
    while stack:
        value, where = stack.pop()
        # Exact types: a subclass (an IntEnum, an OrderedDict) pickles as a reference to its class.
        if type(value) not in _PLAIN_TYPES:
            raise SnapshotError(
                f"{_describe(value)} is not a plain dict, list, tuple, str, bytes, number or None",
                source=source, where=where,
                advice="Convert it (int(x), dict(d), ...) before dumping: a snapshot holds no class.",
            )
        if isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, where))
                stack.append((item, f"{where}.{key}" if where else str(key)))
        elif isinstance(value, (list, tuple)):
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(value))
