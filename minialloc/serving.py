"""The PagedAttention paper's memory experiment on the simulated GPU: contiguous against paged KV, and sharing.

The scheduler it drives is minialloc.paging.scheduler; this module holds the experiment: the request traces, the
two simulations, the comparison and its table (`minialloc serve-sim` prints it).

Reproduces, on one seeded trace, the memory measurements of Kwon et al., "Efficient Memory Management for Large
Language Model Serving with PagedAttention" (SOSP 2023, arXiv:2309.06180):

- Fig. 2 / section 3: the share of KV memory holding real token states in systems that store each request's KV
  contiguously (the paper: 20.4-38.2%) against paged blocks (near-zero waste). The contiguous baselines are the
  paper's three Orca variants: reserve max_model_len per request ("max"), the next power of two of its final
  length ("pow2"), or exactly its final length ("oracle"). Each reservation is one malloc through minialloc's
  CachingAllocator on a simulated GPU holding only the KV budget, so external fragmentation is the allocator's
  real one, and a request that cannot be malloc'ed waits (first come, first served).
- Fig. 15 / section 6.3: memory saved by sharing blocks under parallel sampling and beam search, as blocks saved
  / blocks without sharing (the paper: parallel 6.1-9.8% on Alpaca and 16.2-30.5% on ShareGPT; beam search
  37.6-55.2% and 44.3-66.3%).

Waste, as fractions of the KV memory in use (paged: blocks held by sequences; contiguous: bytes the allocator has
reserved from the device), summed over decode steps (so a step weighs by the memory it holds):
  tokens      slots holding a token's K and V;
  reserved    slots held for tokens the request will still generate (contiguous only: the whole final length is
              reserved at admission; paged takes a block only when the last one is full);
  internal    slots reserved that the request will never use (up to max_model_len; paged: the free tail of each
              sequence's last block; allocator rounding counts here too);
  external    bytes the allocator reserved from the device that lie in no live KV allocation.

The model is OPT-13B (40 layers, hidden 5120, fp16: 2 x 40 x 5120 x 2 = 800 KiB per token) with 12 GiB for KV,
paper Table 1 (A100-40GB: 26 GB of weights, 12 GB KV = 15.7K token slots).

Request lengths. The paper synthesizes requests from the tokenized ShareGPT and Alpaca datasets; its text
(section 6.1, Fig. 11) says "the ShareGPT dataset has 8.4x longer input prompts and 5.8x longer outputs on
average than the Alpaca dataset, with higher variance". The datasets are not shipped here, so lengths are drawn
from lognormal distributions (seeded, numpy default_rng):
  ShareGPT-like: mean input 161, mean output 338 tokens (the means usually quoted for vLLM's ShareGPT trace),
                 sigma 1.0 for both: long right tails.
  Alpaca-like:   mean input 161 / 8.4 = 19.2 and mean output 338 / 5.8 = 58.3 tokens (the paper's ratios; an
                 output mean of ~44 would not match its 5.8x), sigma 0.5 and 0.8: short and narrow.
The sigmas are chosen by hand to give the higher variance of ShareGPT the paper describes, not fitted to the
datasets. vLLM's ShareGPT benchmark drops requests with prompts over 1024 tokens or prompt + output over 2048;
here they are capped at those limits instead, so the trace keeps its size (which lowers the ShareGPT means a
little); every length is at least 1. The trace's measured means are reported with the results.

`minialloc serve-sim --json` prints the result of serve_sim: {"paged": {...}, "contiguous": {...}, ...}, each
system with at least token_share (0..1, the share of KV memory in use holding tokens) and max_concurrent (the most
sequences running at once). "contiguous" is the paper's baseline, reserving max_model_len per request (the "max"
policy); the other two policies are under "contiguous_pow2" and "contiguous_oracle".

A request whose own sequence the whole cache could never hold (prompt + output tokens in more blocks than the
cache has) is rejected when it is queued, with a RequestTooLongError naming the sizes, rather than left waiting
or preempting forever; a parallel or beam group that cannot fit even alone is rejected the same way when that
shows. Every other request is served: out of blocks, the scheduler preempts, and the simulation checks that every
request finished.

Time is in decode steps: each step admits what fits (a prefill) and every running sequence gains one token.
Arrival times are not modelled: all requests wait at step 0, which keeps memory under pressure, the regime the
paper's memory figures describe. A step's prefill costs nothing here, so the step counts compare batching, not
latency, and recompute preemption is free (the preemption count shows how often it happened).

Parallel sampling gives each of n samples the request's output length (the trace has one length per request).
Beam search keeps `width` beams; at each step every beam is, with probability BEAM_REPLACE (0.1), replaced by a
continuation of a uniformly chosen beam (a fork), else it continues itself. That probability is this model's one
free parameter (real beams follow the model's scores), set once for both workloads: Alpaca's beam savings land
in or near the paper's range, while ShareGPT's come out higher at widths 4 and 6 (over long outputs these
beams re-converge more than real ones do).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .allocator import CachingAllocator
from .config import AllocatorConfig
from .device import SimulatedGPU
from .lang import messages, say
from .oom import OutOfMemoryError
from .paging import (
    DEFAULT_BLOCK_SIZE,
    VOCAB,
    BlockManager,
    Group,
    HostPool,
    KVCache,
    KVSpec,
    Request,
    RequestTooLongError,
    Scheduler,
    check_block_invariants,
)
from .sizes import GiB, format_size

OPT_13B = KVSpec(num_layers=40, num_kv_heads=40, head_dim=128, dtype_bytes=2)  # 800 KiB per token
KV_BUDGET_OPT_13B = 12 * GiB  # paper Table 1: what an A100-40GB keeps for KV after OPT-13B's weights
MAX_MODEL_LEN = 2048
MAX_PROMPT_LEN = 1024
PAPER = {
    "token_share_contiguous": (0.204, 0.382),
    "parallel": {"alpaca": (0.061, 0.098), "sharegpt": (0.162, 0.305)},
    "beam": {"alpaca": (0.376, 0.552), "sharegpt": (0.443, 0.663)},
}


@dataclass(frozen=True)
class Workload:
    """Lognormal request lengths: (mean, sigma of the log) for inputs and outputs."""

    name: str
    label: str
    input_mean: float
    input_sigma: float
    output_mean: float
    output_sigma: float


REQUEST_WORKLOADS = {
    "sharegpt": Workload("sharegpt", "ShareGPT-like", 161.0, 1.0, 338.0, 1.0),
    "alpaca": Workload("alpaca", "Alpaca-like", 161.0 / 8.4, 0.5, 338.0 / 5.8, 0.8),
}
WORKLOADS = REQUEST_WORKLOADS  # the older name; minialloc.workloads has allocation traces of its own


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    # a lognormal with E[X] = mean has mu = ln(mean) - sigma^2 / 2
    return rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n)


def sample_requests(workload: str | Workload, num_requests: int, seed: int = 0,
                    max_model_len: int = MAX_MODEL_LEN, max_prompt_len: int = MAX_PROMPT_LEN) -> list[Request]:
    """A seeded trace of requests with random prompt tokens and lengths shaped like the workload."""
    w = REQUEST_WORKLOADS[workload] if isinstance(workload, str) else workload
    rng = np.random.default_rng(seed)
    inputs = np.clip(np.rint(_lognormal(rng, w.input_mean, w.input_sigma, num_requests)), 1, max_prompt_len)
    outputs = np.rint(_lognormal(rng, w.output_mean, w.output_sigma, num_requests))
    outputs = np.clip(outputs, 1, max_model_len - inputs)
    return [Request(i, tuple(rng.integers(0, VOCAB, int(p)).tolist()), int(o))
            for i, (p, o) in enumerate(zip(inputs, outputs, strict=True))]


# -- the two simulations ----------------------------------------------------------------------------------------------
def simulate_paged(requests: Sequence[Request], spec: KVSpec = OPT_13B, kv_bytes: int = KV_BUDGET_OPT_13B,
                   block_size: int = DEFAULT_BLOCK_SIZE, kind: str = "single", width: int = 1,
                   preemption: str = "recompute", seed: int = 0, check: bool = False) -> dict:
    """Serve the trace with paged KV blocks; token/waste shares, concurrency and, for sharing, the blocks saved.

    The KV cache is one allocation through minialloc's CachingAllocator, as vLLM allocates it once at start-up.
    check=True verifies the block manager's invariants after every step (tests).
    """
    allocator = CachingAllocator(SimulatedGPU(kv_bytes), AllocatorConfig())
    cache = KVCache.from_budget(allocator, spec, kv_bytes, block_size)
    manager = BlockManager(cache.num_blocks, block_size)
    host = HostPool(manager, cache.num_blocks) if preemption == "swap" else None  # as big as the GPU's pool
    sched = Scheduler(manager, preemption, host, seed=seed)
    for r in requests:
        sched.add(Group(r, kind, width))
    steps = tokens = used = logical = max_seqs = max_groups = 0
    max_empty = 0.0  # the most unused slots per sequence seen in one step (single sequences only)
    finished = 0
    while sched.waiting or sched.running or sched.swapped:
        decoded = sched.step()
        if not decoded and not sched.running:  # step() rejects what can never fit: this would loop forever
            raise RuntimeError(f"the scheduler made no progress at step {steps}")
        steps += 1
        seqs = [manager.seqs[s] for g in sched.running for s in g.seq_ids]
        step_tokens = sum(len(st.tokens) for st in seqs)
        step_used = len(manager.blocks) - manager.num_free_blocks
        tokens, used = tokens + step_tokens, used + step_used
        logical += sum(len(st.table) for st in seqs)
        max_seqs, max_groups = max(max_seqs, len(seqs)), max(max_groups, len(sched.running))
        if kind == "single" and seqs:
            max_empty = max(max_empty, (step_used * block_size - step_tokens) / len(seqs))
        if check:
            check_block_invariants(manager, host)
        finished += len(sched.retire(decoded))
    cache.release()
    if finished != len(requests) or manager.num_free_blocks != len(manager.blocks):
        raise RuntimeError(f"{len(requests) - finished} request(s) dropped, {manager.num_free_blocks} of "
                           f"{len(manager.blocks)} blocks free at the end")
    slots = used * block_size
    return {
        "token_share": tokens / slots if kind == "single" else None,
        "reserved_share": 0.0,
        "internal_share": (slots - tokens) / slots if kind == "single" else None,
        "external_share": 0.0,
        "sharing_saving": 1 - used / logical,
        "max_concurrent": max_seqs,
        "max_concurrent_requests": max_groups,
        "finished_requests": finished,
        "max_empty_slots_per_seq": max_empty,
        "steps": steps,
        "preemptions": sched.num_preemptions,
        "cow_copies": sched.num_copies,
        "swapped_blocks": sched.num_swapped_blocks,
        "num_blocks": cache.num_blocks,
        "avg_kv_in_use": used * cache.block_bytes / steps,
    }


def _reservation(policy: str, final_len: int, max_model_len: int) -> int:
    if policy == "max":
        return max_model_len
    if policy == "pow2":
        return min(1 << (final_len - 1).bit_length(), max_model_len)
    if policy == "oracle":
        return final_len
    raise ValueError(f"policy must be 'max', 'pow2' or 'oracle', got {policy!r}")


def simulate_contiguous(requests: Sequence[Request], spec: KVSpec = OPT_13B, kv_bytes: int = KV_BUDGET_OPT_13B,
                        max_model_len: int = MAX_MODEL_LEN, policy: str = "max") -> dict:
    """Serve the trace with one contiguous KV reservation per request, malloc'ed at admission, freed at finish."""
    allocator = CachingAllocator(SimulatedGPU(kv_bytes), AllocatorConfig())
    bpt = spec.bytes_per_token
    waiting = deque(requests)
    # req_id -> (ptr, final length, step it finishes, prompt + 1 - step admitted)
    running: dict[int, tuple[int, int, int, int]] = {}
    # tokens held at step t = sum over running of (prompt + 1 + t - admitted) = base + t * len(running)
    base = final_total = 0
    totals = dict.fromkeys(("tokens", "reserved", "internal", "external", "in_use"), 0)
    steps = max_seqs = 0
    retry = True  # the allocator's state changes only when a request finishes: retry admission then
    while waiting or running:
        while retry and waiting:
            r = waiting[0]
            final = len(r.prompt) + r.output_len
            reservation = _reservation(policy, final, max_model_len)
            try:
                ptr = allocator.malloc(reservation * bpt)
            except OutOfMemoryError:
                if not running:
                    raise RequestTooLongError(
                        f"request {r.req_id} is longer than the whole KV cache: its contiguous reservation of "
                        f"{reservation} tokens ({format_size(reservation * bpt)}) does not fit in "
                        f"{format_size(kv_bytes)}") from None
                retry = False
                break
            waiting.popleft()
            running[r.req_id] = (ptr, final, steps + r.output_len - 1, len(r.prompt) + 1 - steps)
            base += len(r.prompt) + 1 - steps
            final_total += final
        tokens = base + steps * len(running)
        reserved, allocated = allocator.memory_reserved(), allocator.memory_allocated()
        totals["tokens"] += tokens * bpt
        totals["reserved"] += (final_total - tokens) * bpt
        totals["internal"] += allocated - final_total * bpt
        totals["external"] += reserved - allocated
        totals["in_use"] += reserved
        max_seqs = max(max_seqs, len(running))
        for rid in [rid for rid, entry in running.items() if entry[2] == steps]:
            ptr, final, _, contribution = running.pop(rid)
            allocator.free(ptr)
            base -= contribution
            final_total -= final
            retry = True
        steps += 1
    return {
        "token_share": totals["tokens"] / totals["in_use"],
        "reserved_share": totals["reserved"] / totals["in_use"],
        "internal_share": totals["internal"] / totals["in_use"],
        "external_share": totals["external"] / totals["in_use"],
        "max_concurrent": max_seqs,
        "finished_requests": len(requests),
        "steps": steps,
        "preemptions": 0,
        "avg_kv_in_use": totals["in_use"] / steps,
    }


# -- the comparison -----------------------------------------------------------------------------------------------
# result keys of the four systems, in table order, with their column labels; "contiguous" is the paper's baseline
SYSTEMS = {"contiguous": "contiguous (max)", "contiguous_pow2": "contiguous (pow2)",
           "contiguous_oracle": "contiguous (oracle)", "paged": "paged"}
# format_table's words, in the notebook's (or MINIALLOC_LANG's) language; --json keeps English
TEXT = messages("minialloc.serving.TEXT", {
    "sys_contiguous": "contiguous (max)",
    "sys_contiguous_pow2": "contiguous (pow2)",
    "sys_contiguous_oracle": "contiguous (oracle)",
    "sys_paged": "paged",
    "header": "serve-sim: {label} trace, {requests} requests (seed {seed}): mean input {mean_input}, mean output "
              "{mean_output} tokens",
    "kv": "KV: {per_token}/token, {total} ({blocks} blocks of {block_size} tokens), max_model_len {max_len}",
    "in_use": "KV memory in use, time-averaged",
    "holding": "  holding tokens",
    "reserved": "  reserved (future tokens)",
    "internal": "  internal fragmentation",
    "external": "  external fragmentation",
    "max_concurrent": "max concurrent sequences",
    "steps": "decode steps to serve the trace",
    "preemptions": "preemptions ({mode})",
    "paper": "paper (Fig. 2): contiguous KV holds tokens in {low}-{high} of its memory; paged wastes under one block "
             "per sequence",
    "gain": "paged runs {gain}x as many sequences at once as {baseline}",
    "sharing": "Sharing (paged, first {n} requests): blocks saved / blocks without sharing",
    "width": "width {n}",
    "paper_column": "paper",
    "parallel": "parallel sampling",
    "beam": "beam search",
})
POLICIES = {"contiguous": "max", "contiguous_pow2": "pow2", "contiguous_oracle": "oracle"}


def serve_sim(workload: str = "sharegpt", num_requests: int = 1000, seed: int = 0, *, spec: KVSpec = OPT_13B,
              kv_bytes: int = KV_BUDGET_OPT_13B, block_size: int = DEFAULT_BLOCK_SIZE,
              max_model_len: int = MAX_MODEL_LEN, preemption: str = "recompute",
              sharing_requests: int | None = None, widths: Sequence[int] = (2, 4, 6)) -> dict:
    """Serve one seeded trace with contiguous KV (three reservation policies) and with paged KV; measure sharing.

    Returns a JSON-ready dict: the trace's measured means; "paged", "contiguous" (reserving max_model_len, the
    paper's baseline), "contiguous_pow2" and "contiguous_oracle", each with the token and waste shares of the KV
    memory in use (token_share in 0..1), max_concurrent (sequences), decode steps and preemptions;
    "concurrency_gain" (paged max_concurrent / contiguous max_concurrent); and the sharing savings under parallel
    sampling and beam search for each width, measured on the trace's first `sharing_requests` requests (default
    num_requests // 4: n samples cost up to n times the tokens), with the paper's figures.
    """
    if workload not in REQUEST_WORKLOADS:
        raise ValueError(f"workload must be one of {sorted(REQUEST_WORKLOADS)}, got {workload!r}")
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    start = time.perf_counter()
    requests = sample_requests(workload, num_requests, seed, max_model_len)
    systems = {"paged": simulate_paged(requests, spec, kv_bytes, block_size, preemption=preemption, seed=seed)}
    systems |= {key: {"policy": policy, **simulate_contiguous(requests, spec, kv_bytes, max_model_len, policy)}
                for key, policy in POLICIES.items()}
    n_share = max(1, num_requests // 4) if sharing_requests is None else sharing_requests
    sharing = {kind: [{"width": w, "saving": simulate_paged(requests[:n_share], spec, kv_bytes, block_size, kind,
                                                            w, preemption, seed)["sharing_saving"]}
                      for w in widths]
               for kind in ("parallel", "beam")}
    return {
        "workload": workload,
        "label": REQUEST_WORKLOADS[workload].label,
        "num_requests": num_requests,
        "seed": seed,
        "mean_input": float(np.mean([len(r.prompt) for r in requests])),
        "mean_output": float(np.mean([r.output_len for r in requests])),
        "bytes_per_token": spec.bytes_per_token,
        "kv_bytes": kv_bytes,
        "block_size": block_size,
        "max_model_len": max_model_len,
        "preemption": preemption,
        **systems,
        "concurrency_gain": systems["paged"]["max_concurrent"] / max(1, systems["contiguous"]["max_concurrent"]),
        "sharing_requests": n_share,
        "sharing": sharing,
        "paper": {"token_share_contiguous": PAPER["token_share_contiguous"],
                  "parallel": PAPER["parallel"][workload], "beam": PAPER["beam"][workload]},
        "elapsed_s": time.perf_counter() - start,
    }


def format_table(result: dict) -> str:
    """The comparison as a plain-text table (what `minialloc serve-sim` prints)."""
    names = [n for n in SYSTEMS if n in result]
    paged = result["paged"]
    low, high = result["paper"]["token_share_contiguous"]
    lines = [
        say(TEXT, "header", label=result["label"], requests=result["num_requests"], seed=result["seed"],
            mean_input=f"{result['mean_input']:.1f}", mean_output=f"{result['mean_output']:.1f}"),
        say(TEXT, "kv", per_token=format_size(result["bytes_per_token"]), total=format_size(result["kv_bytes"]),
            blocks=paged["num_blocks"], block_size=result["block_size"], max_len=result["max_model_len"]),
        "",
        f"{say(TEXT, 'in_use'):<34}" + "".join(f"{say(TEXT, 'sys_' + n):>21}" for n in names),
    ]

    def row(label: str, fmt: str, key: str) -> str:
        return f"{label:<34}" + "".join(f"{format(result[n][key], fmt):>21}" for n in names)

    lines += [
        row(say(TEXT, "holding"), ".1%", "token_share"),
        row(say(TEXT, "reserved"), ".1%", "reserved_share"),
        row(say(TEXT, "internal"), ".1%", "internal_share"),
        row(say(TEXT, "external"), ".1%", "external_share"),
        row(say(TEXT, "max_concurrent"), "d", "max_concurrent"),
        row(say(TEXT, "steps"), "d", "steps"),
        row(say(TEXT, "preemptions", mode=result["preemption"]), "d", "preemptions"),
        say(TEXT, "paper", low=f"{low:.1%}", high=f"{high:.1%}"),
        say(TEXT, "gain", gain=f"{result['concurrency_gain']:.1f}", baseline=say(TEXT, "sys_contiguous")),
        "",
        say(TEXT, "sharing", n=result["sharing_requests"]),
        f"{'':<24}" + "".join(f"{say(TEXT, 'width', n=e['width']):>10}" for e in result["sharing"]["parallel"])
        + f"{say(TEXT, 'paper_column'):>15}",
    ]
    for kind in ("parallel", "beam"):
        label = say(TEXT, kind)
        lo, hi = result["paper"][kind]
        lines.append(f"  {label:<22}" + "".join(f"{e['saving']:>10.1%}" for e in result["sharing"][kind])
                     + f"{f'{lo:.1%}-{hi:.1%}':>15}")
    lines.append(f"({result['elapsed_s']:.1f} s)")
    return "\n".join(lines)
