"""Workloads a student can read: plain lists of allocation events from small generators.

An operation is `MemoryOp(op, name, size, stream, label)`: op "alloc" asks for `size` bytes on `stream` and calls the
result `name`; op "free" frees what `name` holds; op "empty_cache" calls empty_cache(). `label` says what the
memory is for, in words. Replay a list with minialloc.replay.replay(events, allocator).

- canonical_scenario(): "5 GB free, can't allocate 2 GB" on an 8 GiB GPU.
- training_steps(): a transformer's training steps whose sequence length changes from step to step.
- inference_batches(): variable-length inference requests, each holding a contiguous KV cache.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from .sizes import GiB, MiB


class MemoryOp(NamedTuple):
    """One allocator operation of a workload (not a device event: those are the device's)."""

    op: str  # "alloc", "free" or "empty_cache"
    name: str = ""
    size: int = 0
    stream: int = 0
    label: str = ""


def alloc(name: str, size: int, label: str = "", stream: int = 0) -> MemoryOp:
    return MemoryOp("alloc", name, size, stream, label)


def free(name: str) -> MemoryOp:
    return MemoryOp("free", name)


CANONICAL_CAPACITY = 8 * GiB


def canonical_scenario(layers: int = 8) -> list[MemoryOp]:
    """The failure the course is about, on an 8 GiB GPU (CANONICAL_CAPACITY).

    Step 1 runs a big batch: each of 8 layers keeps an 840 MiB activation, so the allocator reserves eight
    840 MiB segments (6.56 GiB); the step ends and they are freed, cached, still reserved. Step 2 runs a smaller
    batch: each layer keeps a 425 MiB activation for the backward pass and uses a workspace of about 410 MiB,
    freed once the next layer has started. Best fit puts both inside an old 840 MiB segment, so when the workspaces are
    gone every segment holds 425 MiB live and a 415 MiB hole. Then the backward pass asks for a 2 GiB gradient:

    - the device has 1.44 GiB free, and 3.24 GiB sits reserved but unallocated in 415 MiB pieces: 4.68 GiB
      (5.0 GB) free in all;
    - no piece is 2 GiB, the device cannot make one, and empty_cache cannot return a segment that holds a live
      block: out of memory.

    With expandable_segments:True the same trace succeeds: the holes are unmapped page by page, and the pages
    are mapped again at the end of one contiguous range.
    """
    events = [alloc(f"act1.{i}", 840 * MiB, f"step 1: activation of layer {i} (big batch)") for i in range(layers)]
    events += [free(f"act1.{i}") for i in range(layers)]
    for i in range(layers):
        events.append(alloc(f"act2.{i}", 425 * MiB, f"step 2: activation of layer {i}, kept for backward"))
        # workspaces grow a little layer by layer (408..415 MiB), so a freed one never fits the next
        events.append(alloc(f"ws2.{i}", (408 + i) * MiB, f"step 2: workspace of layer {i}"))
        if i > 0:
            events.append(free(f"ws2.{i - 1}"))
    events.append(free(f"ws2.{layers - 1}"))
    events.append(alloc("grad", 2 * GiB, "backward: gradient buffer"))
    return events


def training_steps(
    steps: int = 6,
    layers: int = 12,
    hidden: int = 2048,
    heads: int = 16,
    batch: int = 8,
    seq_lens: tuple[int, int] = (256, 2048),
    seed: int = 0,
) -> list[MemoryOp]:
    """Forward and backward passes of a transformer whose sequence length varies from step to step.

    Forward: per layer, an activation kept for backward (batch x seq x hidden, fp16) and attention scores
    (batch x heads x seq x seq, fp16) that are freed after use. Backward: layers in reverse free their
    activation and allocate and free a gradient of the same shape. The weights (12 x hidden^2 fp16 per layer)
    live throughout. Sizes that change a little every step are what fragments a caching allocator.
    """
    rng = random.Random(seed)
    events = [alloc(f"w{i}", 12 * hidden * hidden * 2, f"weights of layer {i}") for i in range(layers)]
    for s in range(steps):
        seq = rng.randint(*seq_lens)
        act = batch * seq * hidden * 2
        scores = batch * heads * seq * seq * 2
        for i in range(layers):
            events.append(alloc(f"s{s}.act{i}", act, f"step {s} (seq {seq}): activation of layer {i}"))
            events.append(alloc(f"s{s}.attn{i}", scores, f"step {s}: attention scores of layer {i}"))
            events.append(free(f"s{s}.attn{i}"))
        for i in reversed(range(layers)):
            events.append(alloc(f"s{s}.grad{i}", act, f"step {s}: gradient of layer {i}"))
            events.append(free(f"s{s}.act{i}"))
            events.append(free(f"s{s}.grad{i}"))
    return events


def inference_batches(
    requests: int = 200,
    concurrency: int = 16,
    bytes_per_token: int = 800 * 1024,
    prompt_lens: tuple[int, int] = (16, 1024),
    output_lens: tuple[int, int] = (16, 512),
    seed: int = 0,
) -> list[MemoryOp]:
    """Requests of varying length served `concurrency` at a time, each with a contiguous KV cache.

    A request allocates KV for its prompt plus its output (bytes_per_token defaults to OPT-13B's 800 KiB) and
    a short-lived logits buffer; requests finish in random order. Contiguous per-request KV of many sizes is
    what paging (minialloc.paging) was invented to avoid.
    """
    rng = random.Random(seed)
    events: list[MemoryOp] = []
    running: list[str] = []
    for r in range(requests):
        if len(running) >= concurrency:
            done = running.pop(rng.randrange(len(running)))
            events.append(free(done))
        tokens = rng.randint(*prompt_lens) + rng.randint(*output_lens)
        events.append(alloc(f"kv{r}", tokens * bytes_per_token, f"request {r}: KV cache for {tokens} tokens"))
        events.append(alloc(f"logits{r}", 50272 * 4 * rng.randint(1, 8), f"request {r}: logits"))
        events.append(free(f"logits{r}"))
        running.append(f"kv{r}")
    events += [free(name) for name in running]
    return events


TRACE_GENERATORS = {
    "canonical": canonical_scenario,
    "training": training_steps,
    "inference": inference_batches,
}

# the older names, which notebooks and tools use
Event = MemoryOp
WORKLOADS = TRACE_GENERATORS
