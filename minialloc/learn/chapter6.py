"""Chapter 6 (beyond): the opening picture, the three failures to fix, and the exercise checkers.

The hidden references live here, not in the notebook: a learner who opens this file reads the answers, which is
fine for a self-learner and no secret worth guarding; the notebook itself gives none away. The fixes are checked
by replay: the failing trace runs again on minialloc with the learner's fix, and the fix counts when no
allocation fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..allocator import CachingAllocator
from ..budget import LLAMA_7B, Model, estimate, plot_budget
from ..device import SimulatedGPU
from ..lang import messages
from ..replay import ReplayResult, replay
from ..sizes import GiB, MiB, format_size
from ..workloads import CANONICAL_CAPACITY, Event, alloc, canonical_scenario, free
from . import NotYet, Wrong, call, expect, explainer, ladder, say

__all__ = ["Canary", "FAILURES", "PROGRAM_FIXES", "TEXT", "WHY", "canary_decision", "check_fit_7b", "check_fixes",
           "opening_figure", "program_fix", "try_fix", "why"]

# Every sentence a learner reads from this chapter (the picture's title, the three stories, the replays' outcomes,
# the checkers' feedback), in English, shown in the notebook's language (minialloc.lang).
TEXT = messages("minialloc.learn.chapter6.TEXT", {
    "opening_title": "Who shares the GPU: training a 1.3B model with Adam, sequences of 2048 tokens",
    "micro_batch": "micro-batch {n}",
    "plan_dict": "return a dict of changes, like {{'micro_batch': 4}}, got {type}",
    "plan_dict_hint": "the keys are Training's field names",
    "unknown_levers": "{keys} cannot be changed here",
    "unknown_levers_hint":
        "the sequence length, the weights' dtype, the workspaces and the CUDA context are given; the levers "
        "are {levers}",
    "plan_blank": "a value in your plan is still ...",
    "whole_number": "{key} must be a whole number, got {value}",
    "whole_number_hint": "write it without quotes or a decimal point",
    "on_off": "{key} is on or off: True or False, got {value}",
    "on_off_hint": "write True or False, without quotes",
    "refused": "estimate() refused your plan: {error}",
    "refused_hint": "look at the values each setting accepts",
    "batch_too_small": "your micro-batch is {n} sequence(s); the team needs at least {min}",
    "batch_too_small_hint": "keep the batch and change how its memory is held instead",
    "over_limit":
        "your plan needs {total} GiB, over the {limit} GiB you may plan for; its largest item is {top} "
        "({top_size} GiB)",
    "over_limit_hint": "which lever shrinks that item, and what does it cost?",
    "fit_passed": "{total} GiB of {limit} GiB",
    "story_A":
        "Training on an 8 GiB GPU dies in the backward pass asking for 2 GiB; the message says 3.24 GiB is "
        "reserved by PyTorch but unallocated. The batch and the model are fixed by the experiment: you may "
        "change only allocator settings.",
    "story_B":
        "Training on an 8 GiB GPU dies in the forward pass; the message says almost everything is allocated "
        "and little is reserved but unallocated. You may change anything.",
    "story_C":
        "Two jobs share an 8 GiB GPU. Job 1 ran an evaluation with big temporary buffers and goes on training "
        "with little memory; job 2 then starts and fails asking for 3 GiB, although job 1's tensors take only "
        "512 MiB. Job 1's batch is fixed; you may add one line to job 1.",
    "job1_itself": "job 1 itself: {outcome}",
    "job2": "job 2: {outcome}; job 1 holds {reserved} reserved, {allocated} allocated",
    "no_failure": "no failure {key}; the failures are {keys}",
    "none_fail": "no allocation fails (peak allocated {allocated}, peak reserved {reserved})",
    "some_fail": "{n} allocation(s) fail, the first at '{label}'; peak allocated {allocated}, peak reserved {reserved}",
    "hint_A":
        "compare reserved-but-unallocated with the request: the memory is there, in pieces, each in a "
        "different segment. Chapter 3's settings act on exactly that kind of waste",
    "hint_B":
        "compare what is allocated with the GPU: if live tensors alone exceed it, no allocator setting can "
        "help",
    "hint_C": "who holds the memory job 2 needs, and in what state: allocated, or cached by job 1's allocator?",
    "fixes_dict": "return a dict with the keys {keys}, got {got}",
    "fixes_dict_hint": "one fix per failure",
    "fix_blank": "a fix is still ...",
    "fix_string": "the fix for {key} must be a string, got {got}",
    "fix_string_hint": "an allocator config like 'max_split_size_mb:128', or one of {fixes}",
    "not_allowed": "failure {key}: '{fix}' changes the program, and the story of {key} does not allow that",
    "not_allowed_hint": "re-read what the story lets you change",
    "neither":
        "failure {key}: {fix} is neither an allocator setting (key:value) nor one of the program changes "
        "{fixes}",
    "neither_hint": "write a PYTORCH_CUDA_ALLOC_CONF setting as in chapter 3, or one of those three names",
    "bad_setting": "failure {key}: minialloc cannot use the setting {fix}: {error}",
    "bad_setting_hint":
        "PYTORCH_CUDA_ALLOC_CONF's syntax is key:value, as in chapter 3 (the value only, without "
        "PYTORCH_CUDA_ALLOC_CONF=)",
    "not_saved": "failure {key} replayed with {fix}: {what}",
    "inflated":
        "failure {key} replayed with {fix}: no allocation fails, but only because every tensor is rounded up: "
        "{allocated} allocated at the peak for the {requested} the program asks for, on a card of {capacity}; "
        "a little more data and it fails again",
    "inflated_hint":
        "compare peak allocated with and without your setting: does it change where the tensors go, or what "
        "each one costs?",
    "inflated_fix":
        "a setting that rounds requests up (roundup_power2_divisions) trades fragmentation for waste inside every"
        " block; pick one that lets freed pieces be reused or given back, as chapter 3 compared",
    "saved": "{key} with {fix}: {what}",
    "all_saved": "every failure is saved by its fix, on replay:",
    "fit_rule":
        "chapter 6, 'Who shares the GPU' and 'What the usual fixes change': which item each lever shrinks, and "
        "by how much",
    "fixes_rule":
        "chapter 6, 'When each fix wins': read this failure's numbers, name its cause, and match it with what a"
        " fix changes",
})

# Why each prediction of this chapter comes out as it does: shown by learn.reveal once the learner has
# predicted, never in the notebook's visible source (a Run All would show it under the blank cell).
WHY = messages("minialloc.learn.chapter6.WHY", {
    "c6-model-state":
        "2 + 2 + 4 + 4 + 4 = 16 bytes per parameter, times {params} parameters, is {gb} GB, which is {gib} GiB "
        "(a GiB is 2**30 bytes, a GB 10**9), before a single activation.",
    "c6-ckpt-fits":
        "checkpointing shrinks only the activations ({before} -> {after} GiB here); the {state} GiB of weights,"
        " gradients and optimizer states stay. The largest item is the optimizer's, so that is where a fix must"
        " act.",
    "c6-defrag-helps":
        "each segment already had its free space in one piece (the live block at the front, the hole behind "
        "it), so sliding blocks to the front changes nothing. The holes are in eight different segments, and a "
        "segment is one cudaMalloc: blocks are cut from one segment's address range only. Joining them takes a "
        "new mapping (expandable segments, stitching), not a move.",
    "c6-stitch-used":
        "device memory is taken by the physical chunks (cuMemCreate), once each: 3 x 4 MiB. A virtual range "
        "(cuMemAddressReserve) costs no device memory, and mapping a chunk at a new address adds nothing.",
    "c6-rollout-peak":
        "the trace starts with {start} already reserved, which is also the run's peak, and a replay starts from"
        " that state, so no setting can show a gain on this trace. The benchmark does not resemble the part of "
        "the run where memory grows: record from earlier (before the model is loaded), and never read \"no "
        "change on this trace\" as \"no benefit\".",
    "c6-canary":
        "the target was \"no slower\", and the canary missed it: 40 release-and-retry events per step each free "
        "the cache and synchronize the device, which is where the 8% went. No OOM is not the whole target. Roll"
        " back (remove the setting, restart the job), then find out on a replay of this job's snapshot why the "
        "new setting keeps running out of cached room.",
})


why = explainer(WHY)  # why(pid, **fields): prediction pid's explanation, in the notebook's language

@dataclass(frozen=True)
class Canary:
    """What a canary job reports, per step, before and after the new setting."""

    step_time_change: float  # +0.08: each step takes 8% longer
    ooms_per_step: tuple[float, float]  # (before, after)
    retries_per_step: tuple[float, float]  # release-and-retry events (num_alloc_retries), (before, after)


def canary_decision(canary: Canary) -> str:
    """The rollout's rule for the target "no slower, fewer out-of-memory errors": keep the setting only if the
    canary met every part of it (no slower, and no more OOMs than before), else roll back."""
    slower = canary.step_time_change > 0
    more_ooms = canary.ooms_per_step[1] > canary.ooms_per_step[0]
    return "roll back" if slower or more_ooms else "keep"


# A model of OPT-1.3B's shape (Zhang et al., 2022: 24 layers, hidden 2048, 32 heads, vocabulary 50272), with the
# parameter count estimated from the shape (12 L h^2 for the layers + V h for the embedding).
SMALL = Model("1.3B (OPT-1.3B's shape)", 12 * 24 * 2048**2 + 50272 * 2048, 24, 2048, 32, 50272)


def opening_figure() -> Any:
    """The chapter's picture: who shares a 24 GiB GPU while a 1.3B model trains, for three micro-batch sizes."""
    budgets = [(say(TEXT, "micro_batch", n=b), estimate(SMALL, micro_batch=b, seq_len=2048)) for b in (1, 4, 8)]
    ax = plot_budget(budgets, 24 * GiB, title=say(TEXT, "opening_title"))
    return ax.figure


# --- exercise c6-fit-7b: make the 7B step fit ------------------------------------------------------------------

FIT_CAPACITY = 80 * GiB
FIT_SHARE = 0.9  # plan for 90%: the caching allocator's rounding and cache need the rest (chapters 1-3)
FIT_MIN_BATCH = 4
_LEVERS = {"micro_batch", "checkpointing", "offload_optimizer", "master_weights", "adam_state_bytes",
           "flash_attention"}


@ladder(TEXT, "fit_rule")
def check_fit_7b(fn: Callable[[], Any]) -> str:
    """fn() returns changes to budget.Training's defaults; the 7B step must fit in 90% of 80 GiB with a
    micro-batch of at least 4 sequences of 4096 tokens."""
    plan = call(fn)
    expect(isinstance(plan, dict), say(TEXT, "plan_dict", type=type(plan).__name__), say(TEXT, "plan_dict_hint"))
    unknown = set(plan) - _LEVERS
    expect(not unknown, say(TEXT, "unknown_levers", keys=sorted(unknown)),
           say(TEXT, "unknown_levers_hint", levers=sorted(_LEVERS)))
    if any(v is Ellipsis for v in plan.values()):
        raise NotYet(say(TEXT, "plan_blank"))
    for key, value in plan.items():  # "checkpointing": "no" would count as on: say so rather than guess
        if key == "micro_batch" or key == "adam_state_bytes":
            expect(isinstance(value, int) and not isinstance(value, bool),
                   say(TEXT, "whole_number", key=key, value=repr(value)), say(TEXT, "whole_number_hint"))
        else:
            expect(isinstance(value, bool), say(TEXT, "on_off", key=key, value=repr(value)), say(TEXT, "on_off_hint"))
    try:
        budget = estimate(LLAMA_7B, **plan)
    except (TypeError, ValueError) as e:
        raise Wrong(say(TEXT, "refused", error=e), say(TEXT, "refused_hint")) from None
    expect(budget.training.micro_batch >= FIT_MIN_BATCH,
           say(TEXT, "batch_too_small", n=budget.training.micro_batch, min=FIT_MIN_BATCH),
           say(TEXT, "batch_too_small_hint"))
    limit = int(FIT_SHARE * FIT_CAPACITY)
    if not budget.fits(limit):
        top = max(budget.items, key=lambda k: budget.items[k])
        raise Wrong(say(TEXT, "over_limit", total=f"{budget.total / GiB:.1f}", limit=f"{limit / GiB:.0f}", top=top,
                        top_size=f"{budget.items[top] / GiB:.1f}"),
                    say(TEXT, "over_limit_hint"))
    return (say(TEXT, "fit_passed", total=f"{budget.total / GiB:.1f}", limit=f"{limit / GiB:.0f}") + "\n"
            + budget.table(FIT_CAPACITY))


# --- exercise c6-choose-fix: three failures, one fix each, checked by replay ---------------------------------------

PROGRAM_FIXES = ("smaller batch", "checkpointing", "empty_cache")


def _training_program(batch: int, checkpointing: bool, layers: int = 8) -> list[Event]:
    """Failure B's program: 1.5 GiB of weights, then per layer an activation of batch x 256 MiB kept for the
    backward pass and a short-lived workspace of batch x 64 MiB. With checkpointing only each layer's input
    (an eighth of its activations) is kept and the layer is recomputed during backward."""
    events = [alloc(f"w{i}", 256 * MiB, f"weights, part {i}") for i in range(6)]
    act, keep = batch * 256 * MiB, batch * 32 * MiB
    for i in range(layers):
        events.append(alloc(f"act{i}", keep if checkpointing else act, f"forward: activation of layer {i}"))
        events.append(alloc(f"ws{i}", batch * 64 * MiB, f"forward: workspace of layer {i}"))
        events.append(free(f"ws{i}"))
    for i in reversed(range(layers)):
        if checkpointing:
            events.append(alloc(f"re{i}", act, f"backward: layer {i} recomputed"))
        events.append(alloc(f"grad{i}", act, f"backward: gradient of layer {i}"))
        if checkpointing:
            events.append(free(f"re{i}"))
        events.append(free(f"act{i}"))
        events.append(free(f"grad{i}"))
    return events


def _evaluation_then_second_job(empty_cache: bool) -> tuple[list[Event], list[Event]]:
    """Failure C: job 1 evaluates with big temporaries (6 GiB, all freed) and keeps running on 512 MiB; then
    job 2 starts on the same GPU and needs 4 GiB."""
    job1 = [alloc("model", 512 * MiB, "job 1: model")]
    job1 += [alloc(f"eval{i}", 1536 * MiB, f"job 1: evaluation buffer {i}") for i in range(4)]
    job1 += [free(f"eval{i}") for i in range(4)]
    if empty_cache:
        job1.append(Event("empty_cache"))
    job2 = [alloc("weights2", 3 * GiB, "job 2: model"), alloc("act2", 1 * GiB, "job 2: activations")]
    return job1, job2


@dataclass(frozen=True)
class Failure:
    key: str
    program_changes: tuple[str, ...]  # the program fixes the story allows

    @property
    def story(self) -> str:
        """The failure's story, in the notebook's language (TEXT["story_" + key])."""
        return say(TEXT, f"story_{self.key}")


FAILURES: dict[str, Failure] = {
    "A": Failure("A", ()),
    "B": Failure("B", ("smaller batch", "checkpointing")),
    "C": Failure("C", ("empty_cache",)),
}


# A setting "saves" a run by luck when it rounds every request up until the pieces happen to fit: the run then
# holds more per tensor than it asks for (roundup_power2_divisions:2 fills failure A's whole 8 GiB card). Ordinary
# rounding (512 B steps, a large-pool remainder of 1 MiB or less kept in its block) costs well under 1% here.
MAX_INFLATION = 1.02  # peak allocated / peak of the bytes requested, above which a setting bought room with waste
_PROGRAMS: dict[str, Callable[[], list[Event]]] = {
    "A": canonical_scenario,
    "B": lambda: _training_program(4, False),
}


def _requested_peak(events: list[Event]) -> int:
    """The highest sum of the bytes the program's live tensors ask for, whatever the allocator rounds."""
    live: dict[str, int] = {}
    now = peak = 0
    for e in events:
        if e.op == "alloc":
            live[e.name] = e.size
            now += e.size
            peak = max(peak, now)
        elif e.op == "free":
            now -= live.pop(e.name, 0)
    return peak


def _expect_no_inflation(key: str, fix: str) -> None:
    """Wrong when the setting saved failure `key` only by rounding its tensors up (see MAX_INFLATION)."""
    events = _PROGRAMS[key]()
    r = _replay_on(events, fix)
    requested = _requested_peak(events)
    if r.peak_allocated > MAX_INFLATION * requested:
        raise Wrong(say(TEXT, "inflated", key=key, fix=repr(fix), allocated=format_size(r.peak_allocated),
                        requested=format_size(requested), capacity=format_size(CANONICAL_CAPACITY)),
                    say(TEXT, "inflated_hint"), fix=say(TEXT, "inflated_fix"))


def _replay_on(events: list[Event], conf: str, gpu: SimulatedGPU | None = None) -> ReplayResult:
    allocator = CachingAllocator(gpu or SimulatedGPU(CANONICAL_CAPACITY), conf)
    return replay(events, allocator)


# Ways people write the program changes: "gradient checkpointing", "torch.cuda.empty_cache()", ...
_PROGRAM_ALIASES = {
    "smaller batch size": "smaller batch", "smaller micro-batch": "smaller batch", "half the batch": "smaller batch",
    "halve the batch": "smaller batch", "gradient checkpointing": "checkpointing",
    "activation checkpointing": "checkpointing",
}


def program_fix(fix: str) -> str:
    """The PROGRAM_FIXES entry `fix` names ("Smaller  batch", "empty_cache()", "torch.cuda.empty_cache()",
    "gradient checkpointing" count too), else ""."""
    name = " ".join(fix.lower().split()).removesuffix("()").removeprefix("torch.cuda.")
    name = _PROGRAM_ALIASES.get(name, name)
    return name if name in PROGRAM_FIXES else ""


def try_fix(key: str, fix: str) -> tuple[bool, str]:
    """Replay failure `key` with `fix` (an allocator config string, or one of PROGRAM_FIXES).
    Returns (saved, what happened in words). Raises ValueError for a config minialloc cannot parse."""
    program = program_fix(fix)
    conf = "" if program else fix
    if key == "A":
        r = _replay_on(canonical_scenario(), conf)
        return r.ooms == 0, _outcome(r)
    if key == "B":
        batch = 2 if program == "smaller batch" else 4
        r = _replay_on(_training_program(batch, program == "checkpointing"), conf)
        return r.ooms == 0, _outcome(r)
    if key == "C":
        gpu = SimulatedGPU(CANONICAL_CAPACITY)
        job1_events, job2_events = _evaluation_then_second_job(program == "empty_cache")
        job1 = CachingAllocator(gpu, conf)
        r1 = replay(job1_events, job1)
        if r1.ooms:  # a setting that breaks job 1 saves nothing
            return False, say(TEXT, "job1_itself", outcome=_outcome(r1))
        r = _replay_on(job2_events, conf, gpu)
        return r.ooms == 0, say(TEXT, "job2", outcome=_outcome(r), reserved=format_size(job1.memory_reserved()),
                                allocated=format_size(job1.memory_allocated()))
    raise KeyError(say(TEXT, "no_failure", key=repr(key), keys=sorted(FAILURES)))


def _outcome(r: ReplayResult) -> str:
    if r.ooms == 0:
        return say(TEXT, "none_fail", allocated=format_size(r.peak_allocated), reserved=format_size(r.peak_reserved))
    return say(TEXT, "some_fail", n=r.ooms, label=r.first_failure_label, allocated=format_size(r.peak_allocated),
               reserved=format_size(r.peak_reserved))


_HINTS = {key: TEXT[f"hint_{key}"] for key in "ABC"}  # each failure's hint (a Text: every language)


@ladder(TEXT, "fixes_rule")
def check_fixes(fn: Callable[[], Any]) -> str:
    """fn() returns {"A": fix, "B": fix, "C": fix}; each fix is replayed on its failure."""
    fixes = call(fn)
    expect(isinstance(fixes, dict) and set(fixes) == set(FAILURES),
           say(TEXT, "fixes_dict", keys=sorted(FAILURES), got=repr(fixes)), say(TEXT, "fixes_dict_hint"))
    if any(v is Ellipsis for v in fixes.values()):
        raise NotYet(say(TEXT, "fix_blank"))
    lines = []
    for key in sorted(FAILURES):
        fix = fixes[key]
        expect(isinstance(fix, str), say(TEXT, "fix_string", key=key, got=repr(fix)),
               say(TEXT, "fix_string_hint", fixes=list(PROGRAM_FIXES)))
        failure = FAILURES[key]
        if program_fix(fix) and program_fix(fix) not in failure.program_changes:
            raise Wrong(say(TEXT, "not_allowed", key=key, fix=fix), say(TEXT, "not_allowed_hint"))
        try:
            saved, what = try_fix(key, fix)
        except (ValueError, TypeError) as e:
            if ":" not in fix:  # neither a setting nor a program change: do not bury that under the parser's list
                raise Wrong(say(TEXT, "neither", key=key, fix=repr(fix), fixes=list(PROGRAM_FIXES)),
                            say(TEXT, "neither_hint")) from None
            raise Wrong(say(TEXT, "bad_setting", key=key, fix=repr(fix), error=e),
                        say(TEXT, "bad_setting_hint")) from None
        if not saved:
            raise Wrong(say(TEXT, "not_saved", key=key, fix=repr(fix), what=what), say(TEXT, f"hint_{key}"),
                        rule=say(TEXT, "fixes_rule"))
        if not program_fix(fix) and key in _PROGRAMS:
            _expect_no_inflation(key, fix)
        lines.append(say(TEXT, "saved", key=key, fix=repr(fix), what=what))
    return say(TEXT, "all_saved") + "\n" + "\n".join(lines)
