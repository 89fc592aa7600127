"""Chapter 7 (the capstone: real failures, you decide): PyTorch 2.13's out-of-memory message with every clause,
the evidence the chapter and lab 5 show, the decision rule (hidden here, never in the notebook), and the checkers.

The message is DeviceCachingAllocator::malloc's in c10/cuda/CUDACachingAllocator.cpp (2.13), one line:

    CUDA out of memory. Tried to allocate {alloc_size}. GPU {d} has a total capacity of {total} of which {free} is
    free. {process lines}{allowed} allowed; Of the allocated memory {allocated + private} is allocated by PyTorch,
    with {private} allocated in private pools (e.g., CUDA Graphs), and {reserved - allocated - private} is reserved
    by PyTorch but unallocated. If reserved but unallocated memory is large try setting ...

- The process lines are reportProcessMemoryInfo's, from NVML, one per process using the GPU, in NVML's order:
  "Including non-PyTorch memory, this process has X memory in use. " for the process whose pid is the caller's,
  "Process N has X memory in use. " for every other. In a container NVML reports the host's pid, which is not the
  caller's: then the process's own line reads "Process N has ...".
- "{allowed} allowed; " only while set_per_process_memory_fraction has set a limit.
- The private-pool clause only when it is not zero. Its figure is the bytes of the *free* cached blocks of the
  private pools (``get_size_block`` sums ``pool.blocks``, a pool's free blocks, over ``graph_pools``): memory the
  graphs' pools hold and the default pools cannot use, whatever the word "allocated" says.

What the message cannot show: memory this process holds outside the caching allocator (the CUDA context, NCCL's
buffers, a library calling cudaMalloc itself) is the difference between the process line and PyTorch's reserved
memory; other processes are only their lines.
"""

from __future__ import annotations

import functools
import random
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..lang import messages
from ..oom import EXPANDABLE_HINT
from ..sizes import GiB, KiB, MiB
from ..sizes import pytorch_format_size as pt_size
from . import NotYet, Wrong, call, explainer, say

__all__ = ["FIXES", "HOLDERS", "TEXT", "WHY", "Evidence", "check_capture", "check_read_oom", "decide", "exhibit",
           "random_evidence", "read_oom", "why"]

# The decisions, in the words the chapter and lab 5 use: who holds the memory the request needs, and the fix that
# gives it back. One fix per holder; the chapter's explanations say why the others do not apply.
HOLDERS = ("live tensors", "cached blocks", "private pools", "other processes", "non-PyTorch memory",
           "memory fraction")
FIXES = {
    "live tensors": "shrink live tensors",  # a smaller batch, activation checkpointing, lower precision
    "cached blocks": "expandable segments",  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    "private pools": "release private pools",  # drop graphs nobody replays, or capture them into one pool
    "other processes": "stop other processes",  # or move them to another GPU
    "non-PyTorch memory": "shrink non-PyTorch memory",  # NCCL's buffers (NCCL_BUFFSIZE), fewer communicators
    "memory fraction": "raise the fraction",  # torch.cuda.set_per_process_memory_fraction
}

TEXT = messages("minialloc.learn.chapter7.TEXT", {
    "not_dict": "read_oom returned a {type}, not a dict",
    "not_dict_hint": "return a dict with the keys {keys}",
    "keys": "for the message {message!r}, your dict's keys are {got}; wanted {keys}",
    "keys_rule":
        "chapter 7, 'Every clause of the message': the dict has one key per figure, even when its clause is absent",
    "keys_hint":
        "an absent clause still has its key: None for this_process and allowed, 0 for private_pools, {{}} for "
        "other_processes",
    "field": "for the message {message!r}, your {key} is {got}",
    "field_rule":
        "chapter 7, 'Every clause of the message': read each figure from its own clause, in PyTorch's units",
    "units_hint":
        "PyTorch's units are binary: KiB, MiB and GiB are powers of 1024, and a figure of 1024 bytes or less is "
        "written 'N bytes'",
    "wrapped_hint":
        "a message copied from a log is often wrapped over several lines and starts with 'torch.OutOfMemoryError: "
        "': read it with any whitespace between the words",
    "own_hint":
        "'Including non-PyTorch memory, this process has ...' is this process's line; every 'Process N has ...' "
        "is another process, keyed by its pid",
    "private_hint":
        "the private-pool clause adds its figure to the allocated figure before it: read each number as printed",
    "absent_hint": "an absent clause is not zero: allowed and this_process are None when their clause is missing",
    "read_passed": "{n} messages read, every clause",
    "capture_blank": "run_and_capture returned without running the step",
    "swallowed": "run_and_capture caught the out-of-memory error and did not raise it again",
    "swallowed_hint": (
        "the program must still fail as it would have without your handler: once the snapshot is written, let the "
        "error go on"),
    "capture_rule":
        "chapter 7, 'Catch it at the moment it fails': switch history on before the step, dump the snapshot in the "
        "handler",
    "no_file": "after the out-of-memory error, there is no snapshot at {path}",
    "no_file_hint": "write the snapshot with dump_snapshot(alloc, path) inside the except clause",
    "no_oom_entry": "the snapshot at {path} has no 'oom' entry in its trace",
    "no_oom_entry_hint": "the trace records only what happens after alloc.record_memory_history(): call it first",
    "not_at_failure": "the snapshot holds {got} reserved; at the failure the allocator held {want}",
    "not_at_failure_hint":
        "dump the snapshot first, before anything (empty_cache, a retry) changes the state you want to read",
    "wrote_without_oom": "the step succeeded, yet a snapshot was written to {path}",
    "wrote_without_oom_hint": "write the snapshot only when the step fails",
    "lost_result": "the step succeeded and returned {want!r}; run_and_capture returned {got!r}",
    "lost_result_hint": "return what the step returned when it succeeds",
    "fix_blank": "write a PYTORCH_CUDA_ALLOC_CONF value (a string) in the cell above",
    "fix_not_text": "my_setting is of type {type}, not a string such as PYTORCH_CUDA_ALLOC_CONF takes",
    "fix_bad": "minialloc cannot read the setting {setting!r}: {error}",
    "fix_failed": "replayed on {capacity} under {setting!r}, the run still fails at trace entry {entry}: {message}",
    "fix_rule": "chapter 7, 'Who holds it?': take the fix of the holder you found for this run",
    "fix_hint":
        "the failure still shows more reserved but unallocated memory than the request: the setting must let the "
        "allocator use those free pieces",
    "fix_passed": "the run finishes on {capacity} under {setting!r}: peak reserved {peak}, peak live {live}",
    "capture_passed": "the snapshot was written at the failure: {reserved} reserved, its last trace entry '{action}'",
})

WHY = messages("minialloc.learn.chapter7.WHY", {
    "c7-fragmented":
        "reserved but unallocated ({unallocated}) is larger than the request ({tried}), so the cache holds enough "
        "free bytes, in pieces none of which fits. PyTorch already called release_cached_blocks before it raised, so "
        "empty_cache() gives back nothing more: what is left is pinned by live blocks. With expandable segments, "
        "free pages are unmapped and mapped again where a request needs them, so scattered free memory serves one "
        "large request; replay the run with them to check.",
    "c7-other":
        "this process holds {this} of the {total}; the other processes hold {others}, and the request needs only "
        "{shortfall} more than is free. No allocator setting of this process can take memory from another: stop "
        "them or move them to another GPU (CUDA_VISIBLE_DEVICES).",
    "c7-container":
        "there is no 'this process' line, and the one process listed holds more than PyTorch's reserved memory "
        "({reserved}): it is this process, seen from outside its container (NVML reports its process id outside the "
        "container). So the live tensors fill the GPU: almost nothing is cached ({unallocated}); make them smaller.",
    "c7-graphs":
        "{private} sit in the free blocks of private pools (CUDA graphs' pools): the clause counts free cached "
        "blocks of those pools, which the default pools cannot use. Expandable segments and empty_cache() do not "
        "touch a pool whose graphs are alive; delete the graphs nobody replays, or capture them into one shared pool.",
    "c7-fraction":
        "the GPU has {free} free, more than the request, but a memory fraction caps this process at {allowed}, and "
        "PyTorch already reserves {reserved}. Raise the fraction (or remove it): the other fixes cannot move a "
        "limit.",
    "c7-nccl":
        "this process holds {this}, of which PyTorch reserved only {reserved}: {outside} lie outside the caching "
        "allocator (here NCCL's communicator buffers, beside the CUDA context). No PyTorch allocator setting "
        "reaches them; shrink them where they are made (NCCL_BUFFSIZE, fewer communicators).",
    "c7-empty-cache":
        "the out-of-memory path already gave every wholly free cached segment back (release_cached_blocks) before "
        "it raised; the {unallocated} still reserved are pieces of segments that live blocks pin. empty_cache() "
        "frees the same segments again: none.",
    "c7-real":
        "replayed on {capacity}, the run fails at trace entry {entry}: {unallocated} reserved but unallocated, more "
        "than the {tried} it tries to allocate, while only {live} are live. The pieces add up; none is big enough.",
    "c7-private-share":
        "{private} of the {reserved} reserved sit in segments of the private pool {pool}: a pool made by "
        "torch.cuda.MemPool or a CUDA graph capture, which only allocations made inside it can use.",
})

why = explainer(WHY)  # why(pid, **fields): prediction pid's explanation, in the notebook's language

# This process's memory outside the caching allocator that no fix gives back: the CUDA context and the kernels'
# code (a few hundred MiB, more with lazy loading off). Beyond it, the outside memory is a holder of its own.
CONTEXT_ALLOWANCE = 1 * GiB

READ_KEYS = ("tried", "gpu", "total", "free", "this_process", "other_processes", "allowed", "allocated",
             "private_pools", "unallocated")


# --- the message ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """The figures behind one out-of-memory message, as the allocator and NVML saw them at the failure.

    ``processes`` is NVML's list, in its order: (pid, bytes in use); the pid ``None`` is this process (its line
    says "this process"); in a container this process shows as a pid like any other. ``allocated`` counts the live
    blocks of every pool, ``private`` the free cached blocks of the private pools, ``reserved`` every pool's
    segments."""

    tried: int
    total: int
    free: int
    allocated: int
    reserved: int
    private: int = 0
    allowed: int | None = None
    processes: tuple[tuple[int | None, int], ...] = ()
    gpu: int = 0
    notes: dict[str, int] = field(default_factory=dict, compare=False)  # what the chapter knows beside the message

    def message(self) -> str:
        """PyTorch 2.13's text for these figures (one line; the double spaces are PyTorch's)."""
        lines = "".join(("Including non-PyTorch memory, this process" if pid is None else f"Process {pid}")
                        + f" has {pt_size(used)} memory in use. " for pid, used in self.processes)
        allowed = f"{pt_size(self.allowed)} allowed; " if self.allowed is not None else ""
        private = (f"with {pt_size(self.private)} allocated in private pools (e.g., CUDA Graphs), "
                   if self.private > 0 else "")
        return (f"CUDA out of memory. Tried to allocate {pt_size(self.tried)}. GPU {self.gpu} has a total capacity "
                f"of {pt_size(self.total)} of which {pt_size(self.free)} is free. {lines}{allowed}"
                f"Of the allocated memory {pt_size(self.allocated + self.private)} is allocated by PyTorch, "
                f"{private}and {pt_size(self.reserved - self.allocated - self.private)} is reserved by PyTorch but "
                f"unallocated.{EXPANDABLE_HINT}")


_SIZE = r"(\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB)"
_UNIT = {"bytes": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB}


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNIT[unit])


def read_oom(message: str) -> dict[str, Any]:
    """The reference reader: every figure of a PyTorch out-of-memory message, in bytes (as printed: two decimals).

    Keys: tried, gpu, total, free, this_process (None without its line), other_processes ({pid: bytes}), allowed
    (None without a fraction), allocated (as printed: private pools included), private_pools (0 without the
    clause), unallocated."""
    text = " ".join(message.split())
    head = re.search(rf"Tried to allocate {_SIZE}\. GPU (\d+) has a total capacity of {_SIZE} of which {_SIZE} is "
                     "free\\.", text)
    if head is None:
        raise ValueError("not a CUDA out-of-memory message: no 'Tried to allocate ... is free.' in it")
    this = re.search(rf"this process has {_SIZE} memory in use", text)
    allowed = re.search(rf"{_SIZE} allowed;", text)
    allocated = re.search(rf"Of the allocated memory {_SIZE} is allocated by PyTorch,", text)
    private = re.search(rf"with {_SIZE} allocated in private pools", text)
    unallocated = re.search(rf"and {_SIZE} is reserved by PyTorch but unallocated", text)
    if allocated is None or unallocated is None:
        raise ValueError("the message has no 'Of the allocated memory ... unallocated' sentence")
    return {
        "tried": _bytes(head.group(1), head.group(2)),
        "gpu": int(head.group(3)),
        "total": _bytes(head.group(4), head.group(5)),
        "free": _bytes(head.group(6), head.group(7)),
        "this_process": _bytes(*this.groups()) if this else None,
        "other_processes": {int(pid): _bytes(n, u)
                            for pid, n, u in re.findall(rf"Process (\d+) has {_SIZE} memory in use", text)},
        "allowed": _bytes(*allowed.groups()) if allowed else None,
        "allocated": _bytes(*allocated.groups()),
        "private_pools": _bytes(*private.groups()) if private else 0,
        "unallocated": _bytes(*unallocated.groups()),
    }


def decide(fields: dict[str, Any]) -> tuple[str, str]:
    """The reference decision on read_oom's figures: (who holds the memory the request needs, the fix).

    In this order: cached blocks when the cache's free pieces add up to the request (fragmentation); the memory
    fraction when the GPU has room but the cap refuses; else, of the holders outside this process's live tensors
    (private pools' free blocks, other processes, this process's memory outside the caching allocator beyond
    CONTEXT_ALLOWANCE), the largest
    if giving it back alone covers the shortfall (the request less the free memory); else the live tensors. A lone
    'Process N' line holding more than PyTorch's reserved memory, with no 'this process' line, is this process
    seen from outside its container."""
    reserved = fields["allocated"] + fields["unallocated"]
    others = dict(fields["other_processes"])
    this = fields["this_process"]
    if this is None and len(others) == 1 and next(iter(others.values())) >= reserved:
        this = others.popitem()[1]
    tried, free = fields["tried"], fields["free"]
    if fields["unallocated"] >= tried:
        holder = "cached blocks"
    elif fields["allowed"] is not None and reserved + tried > fields["allowed"] and free >= tried:
        holder = "memory fraction"
    else:
        outside = max(this - reserved - CONTEXT_ALLOWANCE, 0) if this is not None else 0
        candidates = [("private pools", fields["private_pools"]), ("other processes", sum(others.values())),
                      ("non-PyTorch memory", outside)]
        name, size = max(candidates, key=lambda c: c[1])
        holder = name if size >= tried - free else "live tensors"
    return holder, FIXES[holder]


# --- the chapter's exhibits -----------------------------------------------------------------------------------


def _gib(x: float) -> int:
    return round(x * GiB / MiB) * MiB  # whole MiB, as the allocator's segments are


def exhibit(name: str) -> Evidence:
    """The chapter's evidence: each a failure of a kind users post, with figures made here (no one's log)."""
    if name == "fragmented":  # chapter 2's 8 GiB card, seen through NVML: this process and its CUDA context
        reserved, allocated = _gib(7.44), _gib(3.31)
        return Evidence(tried=2 * GiB, total=_gib(7.75), free=_gib(0.06), allocated=allocated, reserved=reserved,
                        processes=((None, reserved + 262 * MiB),))
    if name == "other":  # a notebook's kernel left running beside a training job
        reserved = _gib(30.2)
        return Evidence(tried=_gib(4.5), total=_gib(39.39), free=_gib(1.12), allocated=_gib(29.9), reserved=reserved,
                        processes=((None, reserved + 510 * MiB), (41177, _gib(7.54))))
    if name == "container":  # the same process, its pid the host's
        reserved = _gib(22.31)
        return Evidence(tried=172 * MiB, total=_gib(23.55), free=38 * MiB, allocated=reserved - 19 * MiB,
                        reserved=reserved, processes=((860120, reserved + 420 * MiB),))
    if name == "graphs":  # torch.compile(mode="reduce-overhead"): its CUDA graphs allocate from a private pool
        reserved = _gib(44.1)
        return Evidence(tried=_gib(2.25), total=_gib(47.53), free=_gib(0.81), allocated=_gib(31.4), reserved=reserved,
                        private=_gib(12.2), processes=((None, reserved + 560 * MiB),))
    if name == "fraction":  # a serving process told to keep to 40% of the card
        return Evidence(tried=_gib(1.5), total=_gib(79.19), free=_gib(45.3), allocated=_gib(31.2),
                        reserved=_gib(31.4), allowed=round(0.4 * _gib(79.19)),
                        processes=((None, _gib(31.4) + 500 * MiB),))
    if name == "nccl":  # 8-way tensor parallel with several communicators, each with its buffers
        reserved = _gib(66.4)
        outside = _gib(4.6)
        return Evidence(tried=_gib(3.0), total=_gib(79.19), free=_gib(2.2), allocated=_gib(65.9), reserved=reserved,
                        processes=((None, reserved + outside),), notes={"outside": outside})
    raise KeyError(f"no exhibit {name!r}; the chapter's are fragmented, other, container, graphs, fraction, nccl")


def exhibit_why(pid: str, name: str) -> str:
    """The explanation of prediction ``pid`` on exhibit ``name``, its figures filled in from the evidence."""
    e = exhibit(name)
    f = read_oom(e.message())
    this = f["this_process"] if f["this_process"] is not None else sum(f["other_processes"].values())
    reserved = f["allocated"] + f["unallocated"]
    others = sum(used for pid_, used in e.processes if pid_ is not None)
    return why(pid, tried=pt_size(e.tried), unallocated=pt_size(f["unallocated"]), this=pt_size(this),
               total=pt_size(e.total), others=pt_size(others), shortfall=pt_size(max(e.tried - e.free, 0)),
               reserved=pt_size(reserved), private=pt_size(f["private_pools"]), free=pt_size(e.free),
               allowed=pt_size(e.allowed or 0), outside=pt_size(max(this - reserved, 0)))


# --- random evidence, for the checkers and the lab's hidden tests ---------------------------------------------


def random_evidence(rng: random.Random, kind: str) -> Evidence:
    """Evidence of one kind of failure (a holder of HOLDERS, or "container": live tensors in a container), with
    figures drawn from ``rng``; decide() names the kind's holder (asserted)."""
    for _ in range(100):
        e = _draw(rng, kind)
        want = "live tensors" if kind == "container" else kind
        if decide(read_oom(e.message()))[0] == want:
            return e
    raise AssertionError(f"no evidence of kind {kind!r} drawn")  # the drawing below is wrong, not the caller


def _draw(rng: random.Random, kind: str) -> Evidence:
    total = rng.choice([_gib(15.6), _gib(23.55), _gib(39.39), _gib(47.53), _gib(79.19), _gib(139.8)])
    context = rng.randint(250, 620) * MiB  # the CUDA context and kernels' code: this process, outside PyTorch
    # "Tried to allocate" is a segment: 2 MiB (small pool), 20 MiB, or a large request rounded to 2 MiB
    tried = rng.choice([2 * MiB, 20 * MiB, rng.randint(6, 500) * 2 * MiB, rng.randint(501, 4096) * 2 * MiB])
    # the driver's free memory at the failure: often a few bytes or KiB, sometimes more, always short of the request
    free = rng.choice([rng.randint(0, 1024), rng.randint(1, 1023) * KiB + rng.randint(0, 1023),
                       rng.randint(0, tried // 2)])
    private = 0
    allowed = None
    others: list[tuple[int | None, int]] = []
    outside = context
    small = max(tried // rng.randint(3, 9), 0)  # a figure too small to cover the shortfall
    if kind == "cached blocks":
        unallocated = tried + rng.randint(0, 4 * tried)
    else:
        unallocated = rng.randint(0, max(tried - 1, 0)) if rng.random() < 0.7 else min(small, tried - 1)
    if kind == "private pools":
        private = (tried - free) + rng.randint(0, 3 * tried)
    elif kind == "other processes":
        others = [(rng.randint(1000, 4_000_000), (tried - free) + rng.randint(0, 3 * tried))]
        if rng.random() < 0.5:
            others.append((rng.randint(1000, 4_000_000), rng.randint(0, small)))
    elif kind == "non-PyTorch memory":
        outside = CONTEXT_ALLOWANCE + (tried - free) + rng.randint(0, 3 * tried)
    elif kind == "memory fraction":
        free = tried + rng.randint(0, total // 4)
    elif rng.random() < 0.5 and kind != "container":  # some live-tensor cases carry small decoys of every kind
        private = rng.randint(0, small)
        others = [(rng.randint(1000, 4_000_000), rng.randint(0, small))]
    budget = total - free - sum(u for _, u in others) - outside - private - unallocated
    allocated = max(budget - rng.randint(0, 64) * MiB, 0)
    reserved = allocated + private + unallocated
    if kind == "memory fraction":
        allowed = reserved + rng.randint(0, tried - 1)
    this = reserved + outside
    if kind == "container":
        processes: list[tuple[int | None, int]] = [(rng.randint(1000, 4_000_000), this)]
    else:
        processes = [(None, this), *others]
        rng.shuffle(processes)
        if rng.random() < 0.1 and kind in ("live tensors", "cached blocks", "private pools", "memory fraction"):
            processes = []  # no NVML: no process lines at all
    return Evidence(tried=tried, total=total, free=free, allocated=allocated, reserved=reserved, private=private,
                    allowed=allowed, processes=tuple(processes), gpu=rng.choice([0, 0, 1, 3, 7]))


def wrapped(message: str, width: int, prefix: str = "torch.OutOfMemoryError: ") -> str:
    """The message as a log shows it: after the exception's name, wrapped at ``width`` characters."""
    import textwrap

    return "\n".join(textwrap.wrap(prefix + message, width, break_long_words=False, break_on_hyphens=False))


def practice_messages(seed: int = 7) -> list[str]:
    """The messages read_oom is checked on: every kind, with and without each optional clause, wrapped or not."""
    rng = random.Random(seed)
    out = [exhibit(n).message() for n in ("fragmented", "other", "container", "graphs", "fraction", "nccl")]
    kinds = (*HOLDERS, "container")
    for i in range(60):
        m = random_evidence(rng, kinds[i % len(kinds)]).message()
        out.append(wrapped(m, rng.choice([72, 100, 120])) if i % 3 == 0 else m)
    return out


# --- exercise c7-read ------------------------------------------------------------------------------------------


def _slip(key: str, got: Any, want: Any) -> str:
    """The hint for the learner's wrong ``key``: the slip their value shows."""
    if key in ("this_process", "other_processes"):
        return "own_hint"
    if key in ("allowed", "private_pools") and got in (0, None) and want not in (0, None):
        return "absent_hint"
    if key in ("allowed", "this_process") and want is None:
        return "absent_hint"
    if key == "allocated" and isinstance(got, int) and isinstance(want, int) and got < want:
        return "private_hint"
    return "units_hint"


def check_read_oom(read: Callable[[str], Any]) -> str:
    """Exercise c7-read: read_oom(message) -> every figure, as the reference reads it."""
    texts = practice_messages()
    for text in texts:
        want = read_oom(text)
        try:
            got = call(read, text)
        except NotYet:
            raise
        except Exception as error:  # a reader that breaks on a wrapped message is the common slip
            if "\n" in text:
                raise Wrong(say(TEXT, "field", message=text[:90] + "...", key="reading", got=repr(error)),
                            say(TEXT, "wrapped_hint"), rule=say(TEXT, "field_rule")) from None
            raise
        if not isinstance(got, dict):
            raise Wrong(say(TEXT, "not_dict", type=type(got).__name__),
                        say(TEXT, "not_dict_hint", keys=", ".join(READ_KEYS)), rule=say(TEXT, "keys_rule"))
        if set(got) != set(READ_KEYS):
            raise Wrong(say(TEXT, "keys", message=_short(text), got=sorted(got), keys=", ".join(READ_KEYS)),
                        say(TEXT, "keys_hint"), rule=say(TEXT, "keys_rule"))
        for key in READ_KEYS:
            if got[key] != want[key] or type(got[key]) is not type(want[key]):
                hint = "wrapped_hint" if "\n" in text and _reads_one_line(read, text) else _slip(
                    key, got[key], want[key])
                raise Wrong(say(TEXT, "field", message=_short(text), key=key, got=repr(got[key])),
                            say(TEXT, hint), rule=say(TEXT, "field_rule"))
    return say(TEXT, "read_passed", n=len(texts))


def _short(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= 400 else one[:400] + "..."


def _reads_one_line(read: Callable[[str], Any], text: str) -> bool:
    """Does the learner's reader get the wrapped message right once it is one line? (Then wrapping is the slip.)"""
    one_line = " ".join(text.split()).removeprefix("torch.OutOfMemoryError: ")
    try:
        return read(one_line) == read_oom(one_line)
    except Exception:
        return False


# --- exercise c7-capture ---------------------------------------------------------------------------------------


def _fragmenting_step(alloc: Any) -> list[int]:
    """Chapter 2's failure in small, on 400 MiB: six 62 MiB segments, each pinned by a 2 MiB block at its front
    (a filler takes the rest while the next pin is placed, so best fit cannot put two pins in one segment), then a
    200 MiB request that none of the six 60 MiB holes fits."""
    keep, fills = [], []
    for _ in range(6):
        big = alloc.malloc(62 * MiB)
        alloc.free(big)
        keep.append(alloc.malloc(2 * MiB))
        fills.append(alloc.malloc(60 * MiB))
    for p in fills:
        alloc.free(p)
    keep.append(alloc.malloc(200 * MiB))  # fails: 360 MiB cached in pieces, 28 MiB on the device
    return keep


def check_capture(run_and_capture: Callable[..., Any]) -> str:
    """Exercise c7-capture: run_and_capture(step, alloc, path) runs step(alloc); when it raises the allocator's
    OutOfMemoryError, writes alloc's snapshot to path at that moment and raises the error again."""
    from ..allocator import CachingAllocator
    from ..device import SimulatedGPU
    from ..oom import OutOfMemoryError
    from ..snapshot import load_snapshot

    rule = say(TEXT, "capture_rule")
    with tempfile.TemporaryDirectory() as tmp:
        ok_path = Path(tmp) / "no-oom.pickle"
        alloc = CachingAllocator(SimulatedGPU("1GiB"), "")
        got = call(run_and_capture, lambda a: a.malloc(3 * MiB) and "done", alloc, str(ok_path))
        if ok_path.exists():
            raise Wrong(say(TEXT, "wrote_without_oom", path=ok_path.name), say(TEXT, "wrote_without_oom_hint"),
                        rule=rule)
        if got != "done":
            raise Wrong(say(TEXT, "lost_result", want="done", got=got), say(TEXT, "lost_result_hint"), rule=rule)
        path = Path(tmp) / "oom.pickle"
        alloc = CachingAllocator(SimulatedGPU("400MiB"), "")
        at_failure = {}

        def step(a: Any) -> Any:
            try:
                return _fragmenting_step(a)
            except OutOfMemoryError:
                at_failure["reserved"] = a.memory_reserved()
                raise

        try:
            call(run_and_capture, step, alloc, str(path))
        except OutOfMemoryError:
            pass
        else:
            if "reserved" not in at_failure:
                raise NotYet(say(TEXT, "capture_blank"))
            raise Wrong(say(TEXT, "swallowed"), say(TEXT, "swallowed_hint"), rule=rule)
        if not path.exists():
            raise Wrong(say(TEXT, "no_file", path=path.name), say(TEXT, "no_file_hint"), rule=rule)
        snap = load_snapshot(path)
        trace = [e for t in snap.get("device_traces", []) for e in t]
        if not any(e["action"] == "oom" for e in trace):
            raise Wrong(say(TEXT, "no_oom_entry", path=path.name), say(TEXT, "no_oom_entry_hint"), rule=rule)
        reserved = sum(s["total_size"] for s in snap["segments"])
        if reserved != at_failure["reserved"]:
            raise Wrong(say(TEXT, "not_at_failure", got=pt_size(reserved), want=pt_size(at_failure["reserved"])),
                        say(TEXT, "not_at_failure_hint"), rule=rule)
    return say(TEXT, "capture_passed", reserved=pt_size(reserved), action=trace[-1]["action"])


# --- the real runs: a replay on a smaller card, a private pool ------------------------------------------------

DATA = Path(__file__).resolve().parents[2] / "course" / "data"
REAL_RUN = "hanfa-small_fp32_seq512_inference.pickle"  # CS336's small model, fp32 inference at context 512
REAL_CAPACITY = 8 * GiB  # the card the chapter replays it on (it was recorded on a bigger one)
PRIVATE_POOL_RUN = "slime-init-model-private-pool.pickle"


@functools.cache
def _snapshot(path: str) -> dict:
    """A real snapshot file, read once per kernel: the checks only read it (each replay builds its own allocator),
    and reading the private-pool file takes seconds."""
    from ..snapshot import load_snapshot

    return load_snapshot(path)


def real_trace(folder: str | Path = DATA) -> Any:
    """The real run's device trace, its state at the first entry rebuilt (minialloc.trace.read_device_trace)."""
    from ..trace import read_device_trace

    path = Path(folder) / REAL_RUN
    return read_device_trace(_snapshot(str(path)), 0, str(path))


def replay_real(setting: str, capacity: int = REAL_CAPACITY, until: int | None = None) -> tuple[Any, Any]:
    """The real run replayed on ``capacity`` under ``setting``: (ReplayResult, the allocator after it)."""
    from ..replay import replay_trace

    return replay_trace(real_trace(), setting, capacity, until=until)


def real_failure() -> tuple[Any, str]:
    """The real run, replayed as recorded (native) on 8 GiB: (its ReplayResult, the PyTorch part of its message)."""
    result, _ = replay_real("")
    return result, result.first_failure_message.split("\n")[0]


def empty_cache_rescues() -> bool:
    """At the real run's failure on 8 GiB: does empty_cache(), then the same request again, succeed?"""
    from ..oom import OutOfMemoryError

    result, _ = real_failure()
    _, alloc = replay_real("", until=result.first_failure_entry)  # the state just before the failing request
    try:
        alloc.malloc(result.first_failure_size)
        return True  # never reached on this run: kept so the answer is measured, not assumed
    except OutOfMemoryError:
        pass
    alloc.empty_cache()
    try:
        alloc.malloc(result.first_failure_size)
    except OutOfMemoryError:
        return False
    return True


def real_why(pid: str) -> str:
    """The explanations of the real run's predictions, with the replay's figures."""
    result, message = real_failure()
    f = read_oom(message)
    return why(pid, capacity=pt_size(REAL_CAPACITY), entry=result.first_failure_entry,
               unallocated=pt_size(f["unallocated"]), tried=pt_size(f["tried"]), live=pt_size(f["allocated"]),
               reserved=pt_size(f["allocated"] + f["unallocated"]))


def check_replay_fix(setting: Any) -> str:
    """Exercise c7-replay-fix: a PYTORCH_CUDA_ALLOC_CONF value under which the real run, replayed on 8 GiB, runs to
    its end."""
    from ..config import ConfigError

    if setting is Ellipsis:
        raise NotYet(say(TEXT, "fix_blank"))
    if not isinstance(setting, str):
        raise Wrong(say(TEXT, "fix_not_text", type=type(setting).__name__), say(TEXT, "fix_hint"),
                    rule=say(TEXT, "fix_rule"))
    try:
        result, _ = replay_real(setting)
    except (ConfigError, ValueError) as error:
        raise Wrong(say(TEXT, "fix_bad", setting=setting, error=str(error).splitlines()[0]), say(TEXT, "fix_hint"),
                    rule=say(TEXT, "fix_rule")) from None
    if result.failed:
        raise Wrong(say(TEXT, "fix_failed", capacity=pt_size(REAL_CAPACITY), setting=setting,
                        entry=result.first_failure_entry, message=result.first_failure_message.split(". GPU")[0]),
                    say(TEXT, "fix_hint"), rule=say(TEXT, "fix_rule"))
    return say(TEXT, "fix_passed", capacity=pt_size(REAL_CAPACITY), setting=setting,
               peak=pt_size(result.peak_reserved), live=pt_size(result.peak_allocated))


def private_share(folder: str | Path = DATA) -> tuple[float, dict[tuple[int, int], int]]:
    """The private-pool run: (the share of its reserved memory in pools other than (0, 0), bytes per pool)."""
    pools = who_uses(_snapshot(str(Path(folder) / PRIVATE_POOL_RUN)))
    total = sum(pools.values())
    return (total - pools.get((0, 0), 0)) / total, pools


def private_why(pid: str) -> str:
    share, pools = private_share()
    private = {p: n for p, n in pools.items() if p != (0, 0)}
    return why(pid, private=pt_size(sum(private.values())), reserved=pt_size(sum(pools.values())),
               pool=", ".join(map(str, private)))


def who_uses(snapshot: dict, pools: Sequence[tuple[int, int]] | None = None) -> dict[tuple[int, int], int]:
    """Reserved bytes per pool id (``segment_pool_id``; (0, 0) the default pools) of a snapshot's segments."""
    out: dict[tuple[int, int], int] = {}
    for seg in snapshot["segments"]:
        pool = tuple(seg.get("segment_pool_id") or (0, 0))
        if pools is None or pool in pools:
            out[pool] = out.get(pool, 0) + seg["total_size"]  # type: ignore[index]
    return out  # type: ignore[return-value]
