"""One reader for recorded runs: a snapshot's trace as replay operations, and the state at its first entry.

Everything that replays a recorded run (the `minialloc replay` and `diagnose` commands, the stepper, the
pictures) reads it here, so they agree on what the run did.

A real trace starts mid-run: `torch.cuda.memory._record_memory_history()` is switched on after the model is
loaded, or its ring buffer (max_entries) dropped the oldest entries. So the trace frees blocks it never allocated,
and most segments existed before its first entry. `state_at_trace_start` rebuilds that state from the snapshot's
final segments and its trace:

- Segments: walk the trace backwards from the final segments, dropping each segment_alloc and restoring each
  segment_free (for expandable segments: cutting out each segment_map's range, restoring each segment_unmap's).
- Live blocks at the first entry: those whose first event in the trace is a free, and the final live blocks the
  trace never allocated. Everything else in a segment was free, one merged block per gap.
- Block sizes: a final block keeps its size. A block freed in the trace has its rounded request (round_size) as
  size, plus, in the large pool, maybe a tail it was not split from (should_split leaves a remainder of 1 MiB or
  less inside the block). A large-pool free block is never 1 MiB or smaller, so a gap of at most 1 MiB right
  after the block is its tail; in a larger gap the first allocation that lands in it before the block is freed
  shows where the free block began (an allocation takes the front of the free block it splits).

The operations (`device_ops`): an 'alloc' entry is a malloc of its requested size; the block is freed at its
'free_completed' (when PyTorch could reuse it; at 'free_requested' when the trace has no completions); an 'oom'
entry is the request that failed, tried again; a run of segment_free / segment_unmap entries is PyTorch giving
back cached segments: followed by a new segment (or an oom) it was a malloc's release-and-retry (RETRY_RELEASE),
else an empty_cache() call (EMPTY_CACHE). Both carry the released addresses: a replay that follows the run
exactly releases just those segments (release_available_cached_blocks, with max_split_size, releases only some),
while a what-if replay calls empty_cache() for the one and leaves the other to its own malloc. segment_alloc and
segment_map entries travel with the next malloc, so a replay at the recorded addresses can place a new segment (or
a new expandable segment's reservation, whose first mapping is at its start) where the run got it.

Every schema PyTorch has written since 2.0 is read (snapshot.upgrade_snapshot), and the segments-only list of
torch.cuda.memory_snapshot() too. What cannot be replayed is said in one line (why_not_replayable): no trace, a
trace with no allocation (a ring buffer of one entry, as the old boolean call _record_memory_history(True) keeps),
or an allocator minialloc does not model
(torch_npu's, cudaMallocAsync). Private pools (segment_pool_id other than (0, 0)) are found per allocation from the
segment it landed in (DeviceTrace.pool_of), so a replay serves it from the same pool.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .config import AllocatorConfig, ConfigError
from .sizes import K_MIN_BLOCK_SIZE, K_SMALL_BUFFER, K_SMALL_SIZE, MiB, readable_size
from .snapshot import SnapshotError, load_snapshot, upgrade_snapshot

MALLOC, FREE, EMPTY_CACHE, OOM, RETRY_RELEASE = 0, 1, 2, 3, 4
_RELEASES = ("segment_free", "segment_unmap")


class TraceError(ValueError):
    """A trace that cannot be read or replayed: the message names the file and the trace entry."""


# An operation is a plain tuple (fast to build, and invisible to the garbage collector):
# (kind, entry index in device_traces[device], size, stream, recorded address, segments made for it: segment_alloc
# addresses, and segment_map addresses negated)
# For OOM the address field holds the entry's device_free.
Op = tuple[int, int, int, int, int, tuple[int, ...]]


@dataclass
class DeviceTrace:
    """One device's trace, read: its operations, the state at its first entry, and what the run reserved."""

    device: int
    entries: list[dict]
    ops: list[Op]
    start_segments: list[dict]
    reserved_at_start: int
    recorded_peak_reserved: int
    oom_entries: list[int] = field(default_factory=list)  # indices of 'oom' entries
    reserved_after: list[int] = field(default_factory=list, repr=False)  # reserved after each entry (recorded)
    from_empty: bool = False  # the state before the trace was left out
    # what the recorded run held at the first entry, even when a from-empty replay leaves it out: reserved bytes
    # (the final segments minus the trace's segment events) and live blocks (freed in the trace before any
    # allocation there, or live at the end and never allocated in it) with their requested bytes
    recorded_reserved_at_start: int = 0
    recorded_live_at_start: tuple[int, int] = (0, 0)
    # trace entry index -> private pool id, for the allocations (and oom requests) a private pool served
    pool_of: dict[int, tuple[int, int]] = field(default_factory=dict)
    # where each expandable reservation the run used begins (one per stream and pool), including those first
    # mapped inside the trace: a replay's reservations must not cover them (replay.unlimited_capacity)
    expandable_bases: tuple[int, ...] = ()

    @property
    def live_at_start(self) -> dict[int, int]:
        """address -> requested size of every block live at the first entry."""
        return {b["address"]: b["requested_size"] for s in self.start_segments for b in s["blocks"]
                if b["state"] == "active_allocated"}

    def capacity_at_oom(self) -> int | None:
        """What PyTorch could use at the first recorded OOM: reserved then plus the driver's free bytes."""
        if not self.oom_entries:
            return None
        i = self.oom_entries[0]
        free = int(self.entries[i].get("device_free", self.entries[i].get("addr", 0)))
        return self.reserved_after[i] + free


# -- reading files ---------------------------------------------------------------------------------------------
def read_snapshot(path: str | Path) -> dict:
    """A snapshot pickle, or TraceError with a one-line reason naming the file.

    Every schema PyTorch has written since 2.0 is read (upgrade_snapshot), and the segments-only list of
    torch.cuda.memory_snapshot() is read as a snapshot with no trace."""
    try:
        return upgrade_snapshot(load_snapshot(path, segment_list=True))
    except SnapshotError as e:
        raise TraceError(str(e)) from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read the file: {e.strerror or e}") from None


def devices(snapshot: dict) -> list[int]:
    """The devices a snapshot says anything about: a non-empty trace or a segment."""
    found = {d for d, t in enumerate(snapshot.get("device_traces") or []) if t}
    found |= {int(s.get("device", 0)) for s in snapshot.get("segments", [])}
    return sorted(found)


def recorded_config(snapshot: dict) -> str:
    """The run's own allocator settings as a config string ('' for PyTorch's defaults).

    Built from allocator_settings' fields (what PyTorch actually used) rather than the PYTORCH_CUDA_ALLOC_CONF
    text, which may hold keys minialloc does not model."""
    s = snapshot.get("allocator_settings") or {}
    parts = []
    # a snapshot written without allocator_settings (older PyTorch) still shows its expandable segments
    expandable = any(seg.get("is_expandable") for seg in snapshot.get("segments", [])) or any(
        e.get("action") in ("segment_map", "segment_unmap") for t in snapshot.get("device_traces") or [] for e in t)
    if s.get("expandable_segments") or ("expandable_segments" not in s and expandable):
        parts.append("expandable_segments:True")
    mss = _max_split_size(snapshot)
    if mss is not None:
        parts.append(f"max_split_size_mb:{mss // MiB}")
    gc = s.get("garbage_collection_threshold", 0.0) or 0.0
    if 0.0 < gc < 1.0:
        parts.append(f"garbage_collection_threshold:{gc}")
    divs = s.get("roundup_power2_divisions") or {}
    if any(divs.values()):
        items = sorted((int(k), int(v)) for k, v in divs.items())
        body = ",".join(f"{k}:{v}" for k, v in items[:-1]) + f",>:{items[-1][1]}"
        parts.append(f"roundup_power2_divisions:[{body}]")
    text = ",".join(parts)
    try:
        AllocatorConfig.parse(text)
    except ConfigError:  # a setting minialloc reads differently: keep what it can
        text = ",".join(p for p in parts if not p.startswith("roundup"))
    return text


def _max_split_size(snapshot: dict) -> int | None:
    """allocator_settings' max_split_size, None when unset (PyTorch records SIZE_MAX, or -1, for no limit)."""
    mss = (snapshot.get("allocator_settings") or {}).get("max_split_size", -1)
    return mss if isinstance(mss, int) and 0 < mss < 2**63 else None


# -- what can be replayed ----------------------------------------------------------------------------------------
NEXT_TIME = ("next time call torch.cuda.memory._record_memory_history(max_entries=1000000) before the run and "
             "torch.cuda.memory._dump_snapshot(FILE) at the OOM")


NPU_RULES = ("round_size adds 32 bytes before rounding to 512, expandable segments align large blocks to 16 KiB, "
             "and its workspace allocator holds memory the trace does not show (torch_npu/csrc/core/npu/"
             "NPUCachingAllocator.cpp)")


def unmodelled_allocator(snapshot: dict) -> str | None:
    """What wrote the snapshot, when it is an allocator minialloc does not model (None: CUDA's native one).

    torch_npu (Ascend) writes PyTorch's schema from its own allocator (Ascend/pytorch,
    torch_npu/csrc/core/npu/NPUCachingAllocator.cpp): its round_size adds 32 bytes to a request before rounding
    it up to 512 (a 65,536-byte tensor gets a 66,048-byte block), DeviceCachingAllocator::malloc aligns large
    blocks of expandable segments to kAlignRoundLarge (16 KiB) by splitting off their front, and a malloc that
    fails first empties NPUWorkspaceAllocator's cache, memory no trace entry shows. Its frames name torch_npu
    and its settings PYTORCH_NPU_ALLOC_CONF, when they are there; else its block sizes give it away
    (npu_block_sizes), read device by device: every device of the file is refused once one shows them and none
    shows CUDA's, since one process has one allocator (a device with no small block to tell is no exception)."""
    settings = snapshot.get("allocator_settings") or {}
    conf = str(settings.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    if any("NPU" in str(k) for k in settings) or _frames_mention(snapshot, ("torch_npu", "c10_npu")):
        return "an Ascend NPU snapshot (torch_npu): its allocator's rules differ from CUDA's"
    npu, cuda = npu_block_sizes(snapshot)
    if npu and not cuda:  # one process, one allocator: a device without small blocks to tell is the same
        return ("an Ascend NPU snapshot (torch_npu): its allocator's rules differ from CUDA's (its blocks are the "
                f"request + 32 bytes rounded up to 512 on device {', '.join(map(str, sorted(npu)))}; {NPU_RULES})")
    if "cudaMallocAsync" in conf:
        return "a cudaMallocAsync snapshot (backend:cudaMallocAsync): CUDA's own pool allocator, not the caching one"
    return None


def npu_block_sizes(snapshot: dict, min_evidence: int = 3) -> tuple[set[int], set[int]]:
    """The devices whose blocks are sized by torch_npu's round_size (request + 32, rounded up to 512), and those
    whose blocks are sized by CUDA's (request rounded up to 512). Only small-pool blocks are read: a small block
    is exactly its rounded request (every split leaves at least 512 bytes), while a large one may keep an unsplit
    tail. A block tells
    the two apart when its request is within 32 bytes of a multiple of 512 (a 65,536-byte request: CUDA 65,536,
    torch_npu 66,048); a device counts as NPU when at least min_evidence such blocks say so and none says CUDA,
    and as CUDA when one says CUDA."""
    votes: dict[int, list[int]] = {}  # device -> [NPU-sized, CUDA-sized]
    for seg in snapshot.get("segments", []):
        if seg.get("segment_type") != "small" or seg.get("is_expandable"):
            continue
        device = int(seg.get("device", 0))
        for b in seg.get("blocks", []):
            requested, size = b.get("requested_size"), b.get("size")
            if b.get("state") != "active_allocated" or not isinstance(requested, int) or requested <= 0:
                continue
            cuda, npu = -(-requested // 512) * 512, -(-(requested + 32) // 512) * 512
            if cuda == npu:
                continue  # this block cannot tell
            count = votes.setdefault(device, [0, 0])
            if size == npu:
                count[0] += 1
            elif size == cuda:
                count[1] += 1
    return ({d for d, (npu, cuda) in votes.items() if npu >= min_evidence and cuda == 0},
            {d for d, (_, cuda) in votes.items() if cuda})


def _frames_mention(snapshot: dict, words: tuple[str, ...], limit: int = 2000) -> bool:
    """Whether a frame names one of `words`, among the first `limit` stacks (a foreign allocator shows at once)."""
    stacks: list = []
    for seg in snapshot.get("segments", []):
        stacks.append(seg.get("frames") or ())
        stacks += [b.get("frames") or () for b in seg["blocks"]]
    for t in snapshot.get("device_traces") or []:
        stacks += [e.get("frames") or () for e in t[:limit]]
    for frames in stacks[:limit]:
        for f in frames:
            text = f"{f.get('filename', '')} {f.get('name', '')}"
            if any(w in text for w in words):
                return True
    return False


def why_not_replayable(snapshot: dict, device: int) -> str | None:
    """One line on why device's trace cannot be replayed (None: it can): a foreign allocator, no trace, or a
    trace with no allocation in it (a ring buffer of one entry, as the old boolean call keeps)."""
    foreign = unmodelled_allocator(snapshot)
    if foreign:
        return f"{foreign}, so minialloc cannot replay it"
    entries = _trace(snapshot, device)
    if not entries:
        return f"no trace for device {device} (history was not recorded), so no what-if is possible; {NEXT_TIME}"
    if not any(e.get("action") in ("alloc", "oom") for e in entries):
        n = len(entries)
        if n == 1:
            # torch.cuda.memory._record_memory_history(True), the boolean form every release still accepts, records
            # with trace_alloc_max_entries=1 (_record_memory_history_legacy's default): only the last event is kept
            return (f"the trace of device {device} holds 1 entry: history was recorded with a ring buffer of one "
                    "entry (what the boolean call torch.cuda.memory._record_memory_history(True) keeps, or "
                    f"max_entries=1), too short to replay; {NEXT_TIME}")
        return (f"the trace of device {device} holds {n} entries and no allocation, too short to replay; "
                f"{NEXT_TIME}")
    return None


# -- operations ------------------------------------------------------------------------------------------------
def _free_action(entries: Sequence[dict]) -> str:
    """The entry that frees a block: 'free_completed' (when PyTorch could reuse it), or 'free_requested' when the
    trace has no completions. One rule for the operations and for the state at the first entry."""
    return "free_completed" if any(e.get("action") == "free_completed" for e in entries) else "free_requested"


def empty_cache_entries(snapshot: dict, device: int, entries: Sequence[dict]) -> set[int]:
    """Indices of the release entries that lie inside an empty_cache() call, as minialloc marks one while it
    records history: a pair of external annotations named "empty_cache", stage START and END, in the form
    PyTorch gives record_function annotations (a PyTorch run wrapped in record_function("empty_cache") with
    global_record_annotations reads the same). The trace entries themselves stay PyTorch's."""
    spans, start = [], None
    for a in snapshot.get("external_annotations") or ():
        if not isinstance(a, dict) or a.get("name") != "empty_cache" or a.get("device", device) != device:
            continue
        if a.get("stage") == "START":
            start = a.get("time_us")
        elif a.get("stage") == "END" and isinstance(start, int) and isinstance(a.get("time_us"), int):
            spans.append((start, a["time_us"]))
            start = None
    if not spans:
        return set()
    return {i for i, e in enumerate(entries) if e.get("action") in _RELEASES and isinstance(e.get("time_us"), int)
            and any(t0 <= e["time_us"] <= t1 for t0, t1 in spans)}


def device_ops(entries: Sequence[dict], max_split_size: int | None = None,
               empty_cache_at: Collection[int] = ()) -> list[Op]:
    """The trace as replay operations (see the module docstring).

    A malloc's retry that releases every free cached segment (release_cached_blocks) leaves the state
    empty_cache() leaves, so such a run is read as EMPTY_CACHE whatever it was. Only with max_split_size set can
    a malloc release some segments and not others (release_available_cached_blocks frees oversize segments, of
    max_split_size or more): a run of such releases followed by a new segment is read as RETRY_RELEASE.
    minialloc's own traces mark empty_cache() with annotations (empty_cache_entries gives empty_cache_at)."""
    free_action = _free_action(entries)
    ops: list[Op] = []
    segs: list[int] = []
    previous = None
    release: list[int] | None = None  # the run of releases in progress: the index of its op, then addresses
    sizes: list[int] = []  # the sizes it released
    for i, e in enumerate(entries):
        action = e.get("action")
        if release is not None and action not in _RELEASES and action not in ("free_requested", "free_completed",
                                                                              "snapshot"):
            k = release[0]
            retry = max_split_size is not None and action in ("segment_alloc", "oom") and ops[k][4] != -1
            retry = retry and all(size >= max_split_size for size in sizes)
            kind = RETRY_RELEASE if retry else EMPTY_CACHE
            ops[k] = (kind, *ops[k][1:5], tuple(release[1:]))
            release = None
        if action == "alloc":
            ops.append((MALLOC, i, int(e["size"]), int(e.get("stream", 0)), int(e["addr"]), tuple(segs)))
            segs = []
        elif action == free_action:
            ops.append((FREE, i, int(e["size"]), int(e.get("stream", 0)), int(e["addr"]), ()))
        elif action == "segment_alloc":
            segs.append(int(e["addr"]))
        elif action == "segment_map":
            segs.append(-int(e["addr"]))  # negative: a mapping, whose range may be a new reservation
        elif action in _RELEASES:
            if previous not in _RELEASES:
                release, sizes = [len(ops)], []
                marked = -1 if i in empty_cache_at else 0  # minialloc's mark of the call
                ops.append((EMPTY_CACHE, i, 0, int(e.get("stream", 0)), marked, ()))
            if release is not None:  # ordinary segments by address, mapped ranges negated
                release.append(int(e["addr"]) if action == "segment_free" else -int(e["addr"]))
                sizes.append(int(e["size"]))
        elif action == "oom":
            free = e.get("device_free", e.get("addr", 0))
            ops.append((OOM, i, int(e["size"]), int(e.get("stream", 0)), int(free), ()))
            segs = []
        if action not in ("free_requested", "free_completed", "snapshot"):
            previous = action  # frees and snapshots do not end a run of releases
    if release is not None:
        k = release[0]
        ops[k] = (*ops[k][:5], tuple(release[1:]))
    return ops


# -- the state at the first trace entry ------------------------------------------------------------------------
def _round(size: int, config: AllocatorConfig) -> int:
    from .allocator import round_size

    return round_size(size, config.roundup_divisions_for(size))


def _segments_at_start(final: list[dict], entries: Sequence[dict], source: str) -> list[dict]:
    """Walk segment events backwards from the final segments (see the module docstring)."""
    plain = {s["address"]: dict(s) for s in final if not s.get("is_expandable")}
    mapped = {s["address"]: dict(s) for s in final if s.get("is_expandable")}
    for i in range(len(entries) - 1, -1, -1):
        e = entries[i]
        action = e.get("action")
        if action == "segment_alloc":
            if plain.pop(e["addr"], None) is None:
                raise TraceError(f"{source}: trace entry {i}: segment_alloc at {e['addr']:#x}, but no later state "
                                 "holds a segment there (the final segments contradict the trace)")
        elif action == "segment_free":
            size = int(e["size"])
            plain[e["addr"]] = {"address": e["addr"], "total_size": size, "stream": int(e.get("stream", 0)),
                                "segment_type": "small" if size == K_SMALL_BUFFER else "large",
                                "is_expandable": False}
        elif action == "segment_map":
            _cut_range(mapped, int(e["addr"]), int(e["size"]), i, source)
        elif action == "segment_unmap":
            _add_range(mapped, int(e["addr"]), int(e["size"]), int(e.get("stream", 0)))
    out = []
    for s in list(plain.values()) + list(mapped.values()):
        out.append({"device": s.get("device", 0), "address": s["address"], "total_size": s["total_size"],
                    "stream": s["stream"], "segment_type": s.get("segment_type", "large"),
                    "segment_pool_id": tuple(s.get("segment_pool_id", (0, 0))),
                    "is_expandable": bool(s.get("is_expandable")), "frames": list(s.get("frames", [])),
                    "blocks": []})
    return sorted(out, key=lambda s: s["address"])


def _cut_range(mapped: dict[int, dict], addr: int, size: int, i: int, source: str) -> None:
    for start, s in list(mapped.items()):
        end = start + s["total_size"]
        if start <= addr and addr + size <= end:
            del mapped[start]
            if addr > start:
                mapped[start] = dict(s, total_size=addr - start)
            if addr + size < end:
                mapped[addr + size] = dict(s, address=addr + size, total_size=end - addr - size)
            return
    raise TraceError(f"{source}: trace entry {i}: segment_map of {addr:#x}+{size}, which no later state has "
                     "mapped (the final segments contradict the trace)")


def _add_range(mapped: dict[int, dict], addr: int, size: int, stream: int) -> None:
    # pages are 2 MiB in the small pool and 20 MiB in the large one: a size that is no multiple of 20 MiB is
    # small; otherwise guess from the nearest mapped range below (the same reservation, most likely)
    below = [s for a, s in mapped.items() if a <= addr]
    if size % (20 * MiB):
        kind = "small"
    else:
        kind = max(below, key=lambda s: s["address"])["segment_type"] if below else "large"
    new = {"address": addr, "total_size": size, "stream": stream, "segment_type": kind, "is_expandable": True}
    for a, s in list(mapped.items()):  # merge with touching ranges of the same pool
        if s["segment_type"] != kind:
            continue
        if a + s["total_size"] == new["address"]:
            del mapped[a]
            new = dict(s, total_size=s["total_size"] + new["total_size"])
        elif new["address"] + new["total_size"] == a:
            del mapped[a]
            new["total_size"] += s["total_size"]
    mapped[new["address"]] = new


def state_at_trace_start(snapshot: dict, device: int = 0, source: str = "<snapshot>",
                         config: str | None = None) -> list[dict]:
    """The segments (snapshot schema) as they were at device_traces[device][0]; see the module docstring.

    config: the run's allocator settings (default: read from the snapshot), for round_size. Raises TraceError
    naming the trace entry where the final state contradicts the trace."""
    entries = _trace(snapshot, device)
    return _start_state(snapshot, device, entries, source, config)[0]


def _trace(snapshot: dict, device: int) -> list[dict]:
    traces = snapshot.get("device_traces") or []
    return list(traces[device]) if 0 <= device < len(traces) else []


def _start_state(snapshot: dict, device: int, entries: list[dict], source: str,
                 config: str | None) -> tuple[list[dict], list[int]]:
    conf = AllocatorConfig.parse(recorded_config(snapshot) if config is None else config)
    final = [s for s in snapshot.get("segments", []) if int(s.get("device", 0)) == device]
    start = _segments_at_start(final, entries, source)
    free_action = _free_action(entries)

    # every address's first and last event in the trace
    first: dict[int, tuple[str, int]] = {}
    last: dict[int, tuple[str, int]] = {}
    allocs: list[tuple[int, int]] = []  # (entry index, address) of every alloc, in time order
    for i, e in enumerate(entries):
        action = e.get("action")
        if action == "alloc" or action == free_action:
            kind = "alloc" if action == "alloc" else "free"
            if kind == "free" and last.get(e["addr"], ("", 0))[0] == "free":
                raise TraceError(f"{source}: trace entry {i}: frees {e['addr']:#x} a second time with no "
                                 "allocation between")
            first.setdefault(e["addr"], (kind, i))
            last[e["addr"]] = (kind, i)
            if kind == "alloc":
                allocs.append((i, e["addr"]))

    final_live = {b["address"]: (s, b) for s in final for b in s["blocks"]
                  if b["state"] in ("active_allocated", "active_pending_free")}
    for addr, (kind, i) in last.items():
        if kind == "alloc" and addr not in final_live:
            raise TraceError(f"{source}: trace entry {i}: allocates {addr:#x} and the trace never frees it, but "
                             "the final state has no live block there (the snapshot contradicts its trace)")
        if kind == "free" and addr in final_live and final_live[addr][1]["state"] == "active_allocated":
            raise TraceError(f"{source}: trace entry {i}: frees {addr:#x} for the last time, but the final state "
                             "has a live block there (the snapshot contradicts its trace)")

    # live blocks at the first entry: (address, size or None if unknown, requested, free entry index, frames)
    live: list[tuple[int, int | None, int, int, list]] = []
    for addr, (_, b) in final_live.items():
        if addr not in first:
            live.append((addr, b["size"], b.get("requested_size", b["size"]), len(entries),
                         list(b.get("frames", []))))
    for addr, (kind, i) in first.items():
        if kind == "free":
            live.append((addr, None, int(entries[i]["size"]), i, list(entries[i].get("frames", []))))

    starts = [s["address"] for s in start]
    by_segment: dict[int, list] = {}
    for item in live:
        k = bisect.bisect_right(starts, item[0]) - 1
        if k < 0 or item[0] >= start[k]["address"] + start[k]["total_size"]:
            where = f"trace entry {item[3]}: frees" if item[3] < len(entries) else "the final state holds"
            raise TraceError(f"{source}: {where} a block at {item[0]:#x} that lies in no segment the run held at "
                             "the first trace entry (the snapshot contradicts its trace)")
        by_segment.setdefault(k, []).append(item)

    for k, seg in enumerate(start):
        blocks = []
        end = seg["address"]
        seg_end = seg["address"] + seg["total_size"]
        large = seg["segment_type"] == "large" and not seg["is_expandable"]
        items = sorted(by_segment.get(k, []))
        for n, (addr, size, requested, freed_at, frames) in enumerate(items):
            if addr < end:
                raise TraceError(f"{source}: trace entry {min(freed_at, len(entries) - 1)}: the block at {addr:#x} "
                                 "overlaps the one before it in the state at the first entry")
            if addr > end:
                blocks.append(_block(end, addr - end, 0, "inactive", []))
            nxt = items[n + 1][0] if n + 1 < len(items) else seg_end
            if size is None:
                size = _round(requested, conf)
                gap = nxt - addr - size
                if large and 0 < gap <= K_SMALL_SIZE:
                    size += gap  # a large-pool free block is never 1 MiB or smaller: this is the block's tail
                elif large and gap > K_SMALL_SIZE:
                    size += _tail_from_allocs(allocs, addr + size, nxt, freed_at)
            blocks.append(_block(addr, size, requested, "active_allocated", frames))
            end = addr + size
        if end > seg_end:
            raise TraceError(f"{source}: the block at {blocks[-1]['address']:#x} runs past the end of its segment "
                             f"{seg['address']:#x}+{seg['total_size']} (the snapshot contradicts its trace)")
        if end < seg_end:
            blocks.append(_block(end, seg_end - end, 0, "inactive", []))
        seg["blocks"] = blocks
        seg["allocated_size"] = seg["active_size"] = sum(b["size"] for b in blocks if b["state"] != "inactive")
        seg["requested_size"] = sum(b["requested_size"] for b in blocks)
    _check_allocs_in_segments(start, entries, source)
    reserved_after = _reserved_curve(entries, sum(s["total_size"] for s in start))
    return start, reserved_after


def _check_allocs_in_segments(start: list[dict], entries: Sequence[dict], source: str) -> None:
    """Every allocation must lie in a segment the run held at the first entry or got during the trace."""
    ranges = sorted([(s["address"], s["address"] + s["total_size"]) for s in start]
                    + [(e["addr"], e["addr"] + e["size"]) for e in entries
                       if e.get("action") in ("segment_alloc", "segment_map")])
    starts = [r[0] for r in ranges]
    reach: list[int] = []  # the furthest end among ranges starting at or before each one (they may overlap)
    for _, end in ranges:
        reach.append(max(end, reach[-1]) if reach else end)
    for i, e in enumerate(entries):
        if e.get("action") == "alloc":
            k = bisect.bisect_right(starts, e["addr"]) - 1
            if k < 0 or e["addr"] >= reach[k]:
                raise TraceError(f"{source}: trace entry {i}: allocates at {e['addr']:#x}, in no segment the run "
                                 "held at the first entry or got later (the snapshot contradicts its trace)")


def _tail_from_allocs(allocs: list[tuple[int, int]], lo: int, hi: int, before: int) -> int:
    """The unsplit tail of a block ending at lo or later: where the first allocation inside [lo, hi) landed
    before the block was freed, if that is at most 1 MiB in (else no tail)."""
    for i, addr in allocs:
        if i >= before:
            break
        if lo <= addr < hi:
            tail = addr - lo
            return tail if tail <= K_SMALL_SIZE and tail % K_MIN_BLOCK_SIZE == 0 else 0
    return 0


def _block(address: int, size: int, requested: int, state: str, frames: list) -> dict:
    return {"address": address, "size": size, "requested_size": requested, "state": state, "frames": frames}


def _reserved_curve(entries: Sequence[dict], reserved: int) -> list[int]:
    out = []
    for e in entries:
        action = e.get("action")
        if action in ("segment_alloc", "segment_map"):
            reserved += int(e["size"])
        elif action in _RELEASES:
            reserved -= int(e["size"])
        out.append(reserved)
    return out


def read_device_trace(snapshot: dict, device: int = 0, source: str = "<snapshot>",
                      from_empty: bool = False) -> DeviceTrace:
    """Everything a replay needs about one device. from_empty: ignore what the run held before the trace."""
    entries = _trace(snapshot, device)
    if not entries:
        raise TraceError(
            f"{source}: the snapshot has no trace for device {device}: record one with "
            "torch.cuda.memory._record_memory_history() (or minialloc's record_memory_history) before the run"
        )
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or "action" not in e:
            raise TraceError(f"{source}: trace entry {i} of device {device} is not a trace entry dict: {e!r:.80}")
        if e["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                           "segment_map", "segment_unmap") and not isinstance(e.get("addr"), int):
            raise TraceError(f"{source}: trace entry {i} ({e['action']}) has no integer 'addr'")
    if from_empty:
        start: list[dict] = []
        # the recorded figures stay the run's own: reserved at the first entry is the final segments' total
        # minus what the trace's segment events added (a from-empty replay leaves it out, the run did not)
        final = sum(int(s["total_size"]) for s in snapshot.get("segments", []) if int(s.get("device", 0)) == device)
        added = _reserved_curve(entries, 0)  # what the trace's segment events add, entry by entry
        recorded_start = max(0, final - added[-1])
        reserved_after = [recorded_start + r for r in added]
        live = _live_before_trace(snapshot, device, entries)
    else:
        start, reserved_after = _start_state(snapshot, device, entries, source, None)
        recorded_start = sum(s["total_size"] for s in start)
        blocks = [b for s in start for b in s["blocks"] if b["state"] == "active_allocated"]
        live = (len(blocks), sum(b["requested_size"] for b in blocks))
    at_start = sum(s["total_size"] for s in start)
    ooms = [i for i, e in enumerate(entries) if e.get("action") == "oom"]
    ops = device_ops(entries, _max_split_size(snapshot), empty_cache_entries(snapshot, device, entries))
    return DeviceTrace(device, entries, ops, start, at_start,
                       max([recorded_start, *reserved_after]), ooms, reserved_after, from_empty,
                       recorded_start, live, _private_pool_entries(snapshot, device, entries),
                       _expandable_bases(snapshot, device, entries, start))


def _expandable_bases(snapshot: dict, device: int, entries: Sequence[dict], start: list[dict]) -> tuple[int, ...]:
    """The lowest mapped address of each (stream, pool, segment type) that has expandable segments, at the first
    entry, at the end, or mapped in between: where each of the run's reservations begins (PyTorch maps from a
    reservation's start up, one reservation per stream and pool). A mapping the final state no longer holds is
    put with its stream and the nearest group below it."""
    final = [s for s in snapshot.get("segments", []) if int(s.get("device", 0)) == device and s.get("is_expandable")]
    ranges = [(s["address"], s["address"] + s["total_size"],
               (s["stream"], tuple(s.get("segment_pool_id", (0, 0))), s.get("segment_type", "large")))
              for s in final + [s for s in start if s["is_expandable"]]]
    lowest: dict[tuple, int] = {}
    for lo, _, key in ranges:
        lowest[key] = min(lo, lowest.get(key, lo))
    for e in entries:
        if e.get("action") != "segment_map":
            continue
        addr = int(e["addr"])
        key = next((k for lo, hi, k in ranges if lo <= addr < hi), None)
        if key is None:  # unmapped again before the end
            below = [(lo, k) for lo, _, k in ranges if lo <= addr and k[0] == int(e.get("stream", 0))]
            key = max(below)[1] if below else ("unknown", addr)
        lowest[key] = min(addr, lowest.get(key, addr))
    return tuple(sorted(set(lowest.values())))


def _private_pool_entries(snapshot: dict, device: int, entries: Sequence[dict]) -> dict[int, tuple[int, int]]:
    """Which private pool served each allocation (trace entry index -> segment_pool_id; the default pool's are
    left out). A trace entry does not name its pool: the segment an allocation lands in does. Walking back from
    the final segments, whose pool is known, each alloc is looked up in the segments that existed at its time.

    A segment the trace frees is gone from the final state; it is taken to be the default pool's, since a private
    pool gives nothing back while it is in use (release_cached_blocks frees only graph_pools_freeable), and every
    pool in the final state was. (A pool deleted and emptied during the trace is not told apart: --check shows
    where that matters.) An 'oom' entry has no address: it takes the pool of the allocation before it."""
    final = [s for s in snapshot.get("segments", []) if int(s.get("device", 0)) == device]
    if all(tuple(s.get("segment_pool_id", (0, 0))) == (0, 0) for s in final):
        return {}
    pools = {s["address"]: (s["address"] + s["total_size"], tuple(s.get("segment_pool_id", (0, 0)))) for s in final}
    starts = sorted(pools)
    found: dict[int, tuple[int, int] | None] = {}
    for i in range(len(entries) - 1, -1, -1):
        e = entries[i]
        action = e.get("action")
        if action == "segment_alloc" and e["addr"] in pools:
            del pools[e["addr"]]
            starts.remove(e["addr"])
        elif action == "segment_free":
            pools[e["addr"]] = (e["addr"] + int(e["size"]), (0, 0))
            bisect.insort(starts, e["addr"])
        elif action == "oom":
            found[i] = None
        elif action == "alloc":
            k = bisect.bisect_right(starts, e["addr"]) - 1
            if k >= 0 and e["addr"] < pools[starts[k]][0]:
                found[i] = pools[starts[k]][1]
            else:  # in an expandable segment's mapping: the final segment holding the address, if any
                found[i] = next((tuple(s.get("segment_pool_id", (0, 0))) for s in final
                                 if s["address"] <= e["addr"] < s["address"] + s["total_size"]), (0, 0))
    out: dict[int, tuple[int, int]] = {}
    before: tuple[int, int] = (0, 0)
    for i in sorted(found):
        pool_id = found[i]
        if pool_id is None:
            pool_id = before
        before = pool_id
        if pool_id != (0, 0):
            out[i] = pool_id
    return out


def _live_before_trace(snapshot: dict, device: int, entries: Sequence[dict]) -> tuple[int, int]:
    """(blocks, requested bytes) live at the first entry, without rebuilding the segments: the blocks whose
    first event is a free, and the final live blocks the trace never allocated."""
    free_action = _free_action(entries)
    seen: set[int] = set()
    count = nbytes = 0
    for e in entries:
        action = e.get("action")
        if action == "alloc":
            seen.add(e["addr"])
        elif action == free_action and e["addr"] not in seen:
            seen.add(e["addr"])
            count, nbytes = count + 1, nbytes + int(e.get("size", 0))
    for s in snapshot.get("segments", []):
        if int(s.get("device", 0)) != device:
            continue
        for b in s.get("blocks", []):
            if b.get("state") in ("active_allocated", "active_pending_free") and b["address"] not in seen:
                count, nbytes = count + 1, nbytes + int(b.get("requested_size", b["size"]))
    return count, nbytes


def top_user_frame(frames: Sequence[dict] | None) -> str:
    """The innermost frame of the user's own Python code: not PyTorch's C++, not torch/ or site-packages.

    Tensors made by the backward pass run on autograd's own C++ thread, with no Python frame: they are named by
    the autograd node that made them ("backward: MmBackward0")."""
    own = user_frames(frames, limit=1)  # one rule for what counts as the user's own code
    if own:
        return own[0]
    if not frames:
        return "(no stack recorded)"
    names = [str(f.get("name", "")) for f in frames]
    for name in names:
        if name.startswith("torch::autograd::generated::") and "::apply" in name:
            return "backward: " + name.split("::")[3].split("_apply")[0].split("(")[0]
        if "torch::autograd::AccumulateGrad" in name:
            return "backward: AccumulateGrad (the .grad tensors)"
    if any("torch::autograd::Engine" in name for name in names):
        return "backward: autograd engine"
    return "(no Python frame)"


def user_frames(frames: Sequence[dict] | None, limit: int = 3) -> list[str]:
    """Up to `limit` of the user's own Python frames, innermost first (see top_user_frame)."""
    out = []
    for f in frames or ():
        filename = str(f.get("filename", ""))
        if filename.endswith(".py") and "site-packages" not in filename and "/torch/" not in filename:
            out.append(f"{f.get('name', '')} ({Path(filename).name}:{f.get('line', 0)})")
            if len(out) == limit:
                break
    return out


def describe(entries: Sequence[dict], i: int) -> str:
    """One line for trace entry i, as a user would look it up."""
    e = entries[i]
    size = e.get("size")
    text = f"entry {i}: {e.get('action')}"
    if isinstance(size, int):
        text += f" {readable_size(size)}"
    if e.get("action") == "oom" and isinstance(e.get("device_free"), int):
        return f"{text} with {readable_size(e['device_free'])} free on the device"
    return f"{text} at {e['addr']:#x}" if isinstance(e.get("addr"), int) else text
