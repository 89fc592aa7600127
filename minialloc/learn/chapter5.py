"""Chapter 5 (diagnosing a real run): the exercise checkers, each run on snapshots with known answers.

Exercise c5-who-holds: find who holds the memory in a snapshot: the bytes of live blocks grouped by the top user
frame that allocated them. Exercise c5-pinned: the segments that are mostly free but pinned by live blocks (none
of them can go back to the device). Each is checked on snapshots built from minialloc runs with stack frames of
three kinds (the program's Python, C++ only from the backward pass, none at all), and on the chapter's real
snapshot when it is present beside the course.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..allocator import CachingAllocator
from ..device import SimulatedGPU
from ..lang import messages
from ..sizes import KiB, MiB, format_size
from ..trace import top_user_frame
from . import NotYet, Wrong, call, expect, explainer, ladder, say

__all__ = ["REAL_SNAPSHOT", "TEXT", "WHY", "check_pinned_segments", "check_who_holds", "practice_snapshots",
           "print_replay", "real_snapshot", "why"]

# Every sentence a learner reads from this chapter's checkers, in English, shown in the notebook's language
# (minialloc.lang).
TEXT = messages("minialloc.learn.chapter5.TEXT", {
    # the German name is dative: the sentences below say "bei {name}" and "von {name}"
    "run_name": "a minialloc run ({config})",
    "not_dict": "on {name}, who_holds returned a {type}, not a dict",
    "not_dict_hint": "return a dict such as {{'forward (train.py:41)': 123456, ...}}",
    "extra_key": "on {name}, your dict has the key {key}, which is the top user frame of no live block",
    "extra_key_hint": "name each block with top_user_frame(block['frames']), and count only live blocks",
    "missing_key": "on {name}, no entry for {key}, which holds live blocks",
    "missing_key_hint": "every active_allocated block counts, including those whose frames are empty or C++ only",
    "pending_hint":
        "blocks in state 'active_pending_free' were freed by the program (they only wait for another "
        "stream): they are not live",
    "every_block_hint":
        "you counted every block of the segments, free ones too: the question is who holds memory now, so "
        "only live blocks (state 'active_allocated') count",
    "size_hint": "add the blocks' 'size' (what they hold), not 'requested_size', for state 'active_allocated' only",
    "bytes_wrong": "on {name}, the bytes for {key} are not what its live blocks hold",
    "who_passed": "on {name}, the largest holder is {holder} with {size}",
    "not_list": "on {name}, pinned_segments returned a {type}, not a list",
    "not_list_hint": "return a list of segment addresses (ints), sorted",
    "unsorted": "on {name}, your addresses are not sorted",
    "unsorted_hint": "the check compares your list with one in increasing address order",
    "unsorted_fix": "return sorted(addresses)",
    "who_rule":
        "chapter 5, 'Who holds the memory?': only live blocks (state 'active_allocated') hold memory, each named "
        "by top_user_frame of its frames",
    "pinned_rule":
        "chapter 5, 'Pinned segments': a segment is pinned by a live block, and its freed bytes are those of "
        "every other block",
    "not_segment": "on {name}, {address} is not the address of a segment",
    "not_segment_hint": "use segment['address'], the start of the segment",
    "not_pinned":
        "on {name} with min_free_fraction={fraction}, the segment at {address} is in your list but is not "
        "pinned",
    "wholly_free_hint": "a wholly free segment is not pinned: empty_cache() can give it back",
    "fraction_hint":
        "compare the freed bytes (blocks in any state but active_allocated) with min_free_fraction * "
        "segment['total_size']",
    "missing_pinned":
        "on {name} with min_free_fraction={fraction}, the segment at {address} is pinned but not in your list",
    "missing_pinned_hint":
        "the freed bytes are those of every block the program has freed: 'inactive' and also "
        "'active_pending_free' (waiting only for another stream); and 'at least' includes the fraction itself",
    "pending_pins_hint":
        "only a live block (active_allocated) pins a segment: a block in active_pending_free only waits for "
        "another stream, and empty_cache() and the OOM retry synchronize before they release",
    "at_least_hint": "this segment's free share is exactly min_free_fraction: 'at least' includes the fraction itself",
    "none_found": "no pinned segment was found in the practice snapshots",
    "pinned_passed": "{n} segments of {name} are at least half free and still pinned",
})

# Why each prediction of this chapter comes out as it does: shown by learn.reveal once the learner has
# predicted, never in the notebook's visible source (a Run All would show it under the blank cell).
WHY = messages("minialloc.learn.chapter5.WHY", {
    "c5-from-empty":
        "the tensors allocated before the first entry (the model, its gradients, the optimizer's state) and the"
        " segments that held them are missing from an empty-GPU replay, so its figures describe no run that "
        "happened. A replay must start from the state at the first trace entry.",
    "c5-check":
        "minialloc's allocator follows PyTorch's rules (best fit per stream, splitting, merging, rounding), so "
        "from the same state the same requests get the same blocks. That holds for requests served from segments"
        " rebuilt at their recorded addresses, and this trace has no segment_alloc at all: every request it makes"
        " is served from them. A new segment's address would come from cudaMalloc, which no replay can "
        "reproduce. Any divergence would be printed with its trace entry. This is what makes the what-if "
        "answers below worth trusting.",
    "c5-new-segments":
        "a training loop repeats the same allocations every step, so after the first steps every request is "
        "served from cached blocks: the cache is warm. Steady state is what a caching allocator is for.",
})


why = explainer(WHY)  # why(pid, **fields): prediction pid's explanation, in the notebook's language

REAL_SNAPSHOT = Path(__file__).resolve().parents[2] / "course" / "data" / "wedsonlin-medium128-training.pickle"

_FRAMES = [
    [{"filename": "/home/me/train.py", "line": 41, "name": "forward"},
     {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1790, "name": "_call_impl"}],
    [{"filename": "/usr/lib/python3/site-packages/torch/optim/adamw.py", "line": 120, "name": "_init_group"},
     {"filename": "/home/me/train.py", "line": 77, "name": "train_step"}],
    [{"filename": "??", "line": 0, "name": "torch::autograd::generated::MmBackward0::apply(...)"},
     {"filename": "??", "line": 0, "name": "__clone"}],
    [],
]


def practice_snapshots() -> Iterator[tuple[str, dict]]:
    """(name, snapshot) pairs the checkers use: two minialloc runs whose blocks carry made-up stack frames (the
    program's own Python, library frames above it, the backward pass's C++ only, no stack), one with a block
    waiting on another stream; and the chapter's real snapshot when it is there. One at a time, so a blank or
    wrong answer is told so before the real file is read."""
    for seed, config in ((1, ""), (2, "expandable_segments:True")):
        rng = random.Random(seed)
        a = CachingAllocator(SimulatedGPU("4GiB"), config)
        live = [a.malloc(rng.choice([700, 64 * KiB, 3 * MiB, 12 * MiB, 30 * MiB])) for _ in range(60)]
        for p in live[::3]:
            a.free(p)
        pending = a.malloc(3 * MiB, stream=2)  # alone in a 20 MiB segment of stream 2
        a.record_stream(pending, 1)
        a.free(pending)  # active_pending_free: freed, not live; it delays reuse but does not pin its segment
        snap = a.snapshot()
        for seg in snap["segments"]:
            for b in seg["blocks"]:
                b["frames"] = list(rng.choice(_FRAMES)) if b["state"] != "inactive" else []
        yield say(TEXT, "run_name", config=config or "native"), snap
    if REAL_SNAPSHOT.exists():
        yield REAL_SNAPSHOT.name, real_snapshot()


def print_replay(path: str, trace: Any, settings: str, configs: Sequence[str] = (), capacity: int | None = None,
                 fit: bool = True) -> None:
    """Print the table ``minialloc replay PATH [--conf C ...]`` prints, from a trace the notebook has already read
    (the command would load and validate the file again, seconds for a real one, in a new process)."""
    from ..cli import _print_device_table  # the command's own table and words, so both read the same
    from ..replay import DEFAULT_WHAT_IF, verdict, what_if_trace

    cap, source = capacity, "--capacity"
    if cap is None and trace.capacity_at_oom() is not None:
        cap, source = trace.capacity_at_oom(), "oom"
    rows = what_if_trace(trace, settings, tuple(configs) or DEFAULT_WHAT_IF, cap, fit=fit)
    _print_device_table(path, trace, cap, source, rows, verdict(rows, cap, trace.reserved_at_start), False)


_REAL_BYTES: dict[tuple[str, int, int], bytes] = {}  # (path, mtime, size) -> the file's bytes, once validated


def real_snapshot() -> dict:
    """A fresh copy of the chapter's real snapshot for each check (a learner's function may change what it is
    given). load_snapshot also checks the schema of every block and frame, seconds for this 3 MB file; this file
    is the course's own, its schema checked by the tests (tests/test_real_snapshots.py), so the checks read it
    once and unpickle each copy from its bytes with load_snapshot's restricted unpickler, which lets no class or
    function out of any file."""
    import io

    from ..snapshot import _PlainUnpickler

    stat = REAL_SNAPSHOT.stat()
    key = (str(REAL_SNAPSHOT), stat.st_mtime_ns, stat.st_size)
    if key not in _REAL_BYTES:
        _REAL_BYTES.clear()
        _REAL_BYTES[key] = REAL_SNAPSHOT.read_bytes()
    snap = _PlainUnpickler(io.BytesIO(_REAL_BYTES[key])).load()
    snap.setdefault("device_traces", [])
    return snap


def _who_holds(snapshot: dict, states: tuple[str, ...] = ("active_allocated",), size: str = "size"
               ) -> dict[str, int]:
    """The reference (live blocks, their size); other ``states`` or ``size`` give the usual slips to diagnose."""
    held: dict[str, int] = {}
    for seg in snapshot["segments"]:
        for b in seg["blocks"]:
            if b["state"] in states:
                name = top_user_frame(b.get("frames"))
                held[name] = held.get(name, 0) + b.get(size, b["size"])
    return held


def _slip_hint(got: dict, snapshot: dict) -> str:
    """Which known slip gives exactly the learner's dict: the hint for it, or the general one."""
    slips = [
        ("every_block_hint", _who_holds(snapshot, ("active_allocated", "active_pending_free", "inactive"))),
        ("pending_hint", _who_holds(snapshot, ("active_allocated", "active_pending_free"))),
        ("size_hint", _who_holds(snapshot, size="requested_size")),
    ]
    for hint, wrong in slips:
        if {k: v for k, v in got.items() if v} == {k: v for k, v in wrong.items() if v}:
            return hint
    return "size_hint"


@ladder(TEXT, "who_rule")
def check_who_holds(who_holds: Callable[[dict], Any]) -> str:
    """Exercise c5-who-holds: who_holds(snapshot) -> {top user frame: bytes of live blocks}."""
    for name, snap in practice_snapshots():
        got = call(who_holds, snap)
        if not isinstance(got, dict):
            raise Wrong(say(TEXT, "not_dict", name=name, type=type(got).__name__), say(TEXT, "not_dict_hint"))
        want = _who_holds(snap)
        extra = sorted(set(got) - set(want))
        missing = sorted(set(want) - set(got))
        if got != want and _slip_hint(got, snap) != "size_hint":  # a known slip, named before its symptoms
            raise Wrong(say(TEXT, "bytes_wrong", name=name, key=repr(next(k for k in got if got[k] != want.get(k)))),
                        say(TEXT, _slip_hint(got, snap)))
        if extra:
            raise Wrong(say(TEXT, "extra_key", name=name, key=repr(extra[0])), say(TEXT, "extra_key_hint"))
        if missing:
            raise Wrong(say(TEXT, "missing_key", name=name, key=repr(missing[0])), say(TEXT, "missing_key_hint"))
        for key in want:
            if got[key] != want[key]:
                raise Wrong(say(TEXT, "bytes_wrong", name=name, key=repr(key)), say(TEXT, _slip_hint(got, snap)))
    top = max(want.items(), key=lambda kv: kv[1])
    return say(TEXT, "who_passed", name=name, holder=top[0], size=format_size(top[1]))


def _free_bytes(seg: dict) -> int:
    """Bytes of a segment's blocks the program has freed: 'inactive', and 'active_pending_free' (waiting only for
    another stream; empty_cache() and the OOM retry synchronize first, so such a block does not pin)."""
    return sum(b["size"] for b in seg["blocks"] if b["state"] != "active_allocated")


def _pinned(snapshot: dict, min_free_fraction: float) -> list[int]:
    out = []
    for seg in snapshot["segments"]:
        live = any(b["state"] == "active_allocated" for b in seg["blocks"])
        free = _free_bytes(seg)
        if live and free >= min_free_fraction * seg["total_size"]:
            out.append(seg["address"])
    return sorted(out)


@ladder(TEXT, "pinned_rule")
def check_pinned_segments(pinned_segments: Callable[..., Any]) -> str:
    """Exercise c5-pinned: pinned_segments(snapshot, min_free_fraction) -> sorted addresses of the segments holding
    at least one live (active_allocated) block and at least that fraction of freed bytes (any other state)."""
    found = 0
    for name, snap in practice_snapshots():
        for fraction in (0.5, 0.9):
            got = call(pinned_segments, snap, fraction)
            if not isinstance(got, (list, tuple)):
                raise Wrong(say(TEXT, "not_list", name=name, type=type(got).__name__), say(TEXT, "not_list_hint"))
            want = _pinned(snap, fraction)
            got = list(got)
            expect(got == sorted(got), say(TEXT, "unsorted", name=name), say(TEXT, "unsorted_hint"),
                   fix=say(TEXT, "unsorted_fix"))
            extra = [a for a in got if a not in want]
            if extra:
                seg = next((s for s in snap["segments"] if s["address"] == extra[0]), None)
                if seg is None:
                    raise Wrong(say(TEXT, "not_segment", name=name, address=repr(extra[0])),
                                say(TEXT, "not_segment_hint"))
                wholly_free = all(b["state"] == "inactive" for b in seg["blocks"])
                no_live = not any(b["state"] == "active_allocated" for b in seg["blocks"])
                hint = "wholly_free_hint" if wholly_free else "pending_pins_hint" if no_live else "fraction_hint"
                raise Wrong(say(TEXT, "not_pinned", name=name, fraction=fraction, address=f"{extra[0]:#x}"),
                            say(TEXT, hint))
            missing = [a for a in want if a not in got]
            if missing:
                seg = next(s for s in snap["segments"] if s["address"] == missing[0])
                hint = "at_least_hint" if _free_bytes(seg) == fraction * seg["total_size"] else "missing_pinned_hint"
                raise Wrong(say(TEXT, "missing_pinned", name=name, fraction=fraction, address=f"{missing[0]:#x}"),
                            say(TEXT, hint))
            found += len(want)
            if fraction == 0.5:
                last = (name, len(want))
    if not found:
        raise NotYet(say(TEXT, "none_found"))
    return say(TEXT, "pinned_passed", n=last[1], name=last[0])
