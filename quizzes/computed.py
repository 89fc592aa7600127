"""Computed questions: a scenario drawn from a seed, run on minialloc, and the number it produces.

A bank question of kind "computed" names one generator below. The generator draws the scenario's parameters
from a random.Random seeded by (generator name, seed), runs the scenario on minialloc's allocator or block
manager, and returns a Variant: the parameters as strings for the question's text and explanation templates,
the answer that minialloc computed, the answers the usual wrong rules give (`wrong`), and an exhibit to read (a
memory summary or an OOM message, in PyTorch's words), or none.

No exhibit is code: a code exhibit is one line away from its answer (add `print(alloc.memory_allocated())` and
run it), so the scenario is told in words and the learner applies the rule to new numbers. Numbers are drawn
again until every wrong rule of `wrong` gives an answer different from the right one and from each other (a
1000-byte tensor rounds to 1024 bytes by the 512-byte rule and by the power-of-two guess alike; such draws are
refused), so a right answer is evidence of the rule. Nothing here is a formula for the answer: the allocator
computes it, so the questions stay right if the course's allocator model changes, and tests/test_quiz_computed.py
rebuilds each scenario from its parameters and checks the answers against minialloc.

The seed is the student id (graded quiz) or a session seed (practice), so two students get different numbers
and an answer cannot be copied; with the same seed the numbers are the same, so a grader can recompute them.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from minialloc import CachingAllocator, OutOfMemoryError, SimulatedGPU
from minialloc.paging import BlockManager
from minialloc.sizes import GiB, MiB

BLOCK_TOKENS = 16  # PagedAttention's default block size, used by every paging scenario


@dataclass(frozen=True)
class Variant:
    """One drawing of a computed question."""

    params: dict[str, str]  # values for the {placeholders} of the question's text and explanation
    answer: float  # what minialloc computed, in the question's unit
    exhibit: str = ""  # shown under the question, in a monospace block: a summary or a message, never code
    wrong: dict[str, float] = field(default_factory=dict)  # misconception -> the answer it gives


Generator = Callable[[random.Random], Variant]
GENERATORS: dict[str, Generator] = {}


def generator(fn: Generator) -> Generator:
    GENERATORS[fn.__name__] = fn
    return fn


def rng_for(name: str, seed: object) -> random.Random:
    """A random.Random that depends only on (name, seed): the same student always gets the same numbers."""
    digest = hashlib.sha256(f"{name}|{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def generate(name: str, seed: object) -> Variant:
    """Draw generator `name`'s scenario for `seed` and run it on minialloc."""
    try:
        fn = GENERATORS[name]
    except KeyError:
        raise KeyError(f"no computed-question generator {name!r}; known: {', '.join(sorted(GENERATORS))}") from None
    variant = fn(rng_for(name, seed))
    params = dict(variant.params)
    params.setdefault("answer", _fmt(variant.answer))
    return Variant(params, variant.answer, variant.exhibit, variant.wrong)


def distinct(answer: float, wrong: dict[str, float], gap: float = 0.5) -> bool:
    """Whether every wrong rule's answer differs from the right one and from every other by more than `gap`."""
    values = [answer, *wrong.values()]
    return all(abs(a - b) > gap for i, a in enumerate(values) for b in values[i + 1:])


def _fmt(x: float) -> str:
    """A number as the explanations print it: no trailing .0, at most two decimals."""
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}".rstrip("0")


def _fresh(capacity: str = "8GiB", config: str = "") -> CachingAllocator:
    return CachingAllocator(SimulatedGPU(capacity), config)


# -- chapter 1: rounding, segment sizes, best fit and splitting ---------------------------------------------------

def _unaligned(rng: random.Random) -> int:
    n = rng.randrange(1000, 1_000_000)
    while n % 512 == 0:
        n = rng.randrange(1000, 1_000_000)
    return n


def _round512(n: int) -> int:
    return -(-n // 512) * 512


def _power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


@generator
def rounding_allocated(rng: random.Random) -> Variant:
    """Two small tensors, the first freed: memory_allocated() is the second request rounded up to 512 bytes."""
    while True:
        first, n = _unaligned(rng), _unaligned(rng)
        alloc = _fresh()
        x = alloc.malloc(first)
        alloc.malloc(n)
        alloc.free(x)
        answer = alloc.memory_allocated()
        wrong = {"no rounding: the request itself": n, "rounded up to a power of two": _power_of_two(n),
                 "the freed tensor still counted": _round512(first) + _round512(n),
                 "the small pool's 2 MiB segment": 2 * MiB}
        if distinct(answer, wrong):
            return Variant({"n": str(n), "first": str(first)}, answer, wrong=wrong)


@generator
def segment_reserved(rng: random.Random) -> Variant:
    """One tensor, then freed: reserved is still its segment's size (2 MiB, 20 MiB, or rounded to 2 MiB)."""
    while True:
        kind = rng.choice(("small", "medium", "large"))
        lo, hi = {"small": (4096, MiB), "medium": (MiB + 4096, 10 * MiB - 4096),
                  "large": (10 * MiB, 900 * MiB)}[kind]
        n = rng.randrange(lo, hi)
        alloc = _fresh()
        alloc.free(alloc.malloc(n))
        answer = alloc.memory_reserved() / MiB
        wrong = {"freed memory goes back to the device": 0.0, "the request rounded to 512 bytes": _round512(n) / MiB,
                 "rounded up to a power of two": _power_of_two(n) / MiB}
        if kind == "medium":
            wrong["rounded up to a multiple of 2 MiB"] = -(-n // (2 * MiB)) * 2.0  # the large pool's rule
        else:
            wrong["a 20 MiB segment for every request"] = 20.0
        if distinct(answer, wrong, gap=0.004):
            return Variant({"n": str(n), "n_mib": f"{n / MiB:.2f}"}, answer, wrong=wrong)


@generator
def reserved_after_sequence(rng: random.Random) -> Variant:
    """Tensors kept alive: best fit packs the 2-9 MiB ones into 20 MiB segments; a big one gets its own."""
    while True:
        sizes = [rng.randint(2, 9) for _ in range(rng.randint(4, 7))]
        sizes.insert(rng.randrange(len(sizes) + 1), rng.randint(11, 40))
        alloc = _fresh()
        for s in sizes:
            alloc.malloc(s * MiB)
        answer = alloc.memory_reserved() / MiB
        own = sum(20 if s < 10 else s + s % 2 for s in sizes)
        wrong = {"reserved is the sum of the requests": float(sum(sizes)),
                 "every tensor gets a segment of its own": float(own)}
        if distinct(answer, wrong):
            return Variant({"sizes": ", ".join(map(str, sizes))}, answer, wrong=wrong)


@generator
def best_fit_block(rng: random.Random) -> Variant:
    """Free cached blocks, each a segment of its own, and one request: best fit takes the smallest block that
    fits, not the first one in address order, not the largest, and no new segment while one fits."""
    while True:
        blocks = rng.sample(range(12, 60, 2), rng.randint(3, 5))
        request = rng.randint(11, max(blocks) - 1)
        alloc = _fresh()
        ptrs = [alloc.malloc(b * MiB) for b in blocks]  # each its own segment (large pool, rounded to 2 MiB)
        for p in ptrs:
            alloc.free(p)
        order = sorted(range(len(blocks)), key=lambda i: ptrs[i])
        blocks = [blocks[i] for i in order]  # as the question lists them: in address order
        ptrs = [ptrs[i] for i in order]
        got = alloc.malloc(request * MiB)  # a block taken from the cache starts where its segment starts
        if got not in ptrs:
            continue  # a new segment: not the question this asks
        answer = float(blocks[ptrs.index(got)])
        wrong = {"first fit: the first block in address order that fits": float(next(b for b in blocks
                                                                                    if b >= request)),
                 "the largest block, to leave the largest remainder": float(max(blocks)),
                 "a new segment of the request's size": float(request + request % 2)}
        if distinct(answer, wrong):
            return Variant({"blocks": ", ".join(map(str, blocks)), "request": str(request)}, answer, wrong=wrong)


# -- chapter 2: the OOM message, the summary, empty_cache, fragmentation -----------------------------------------

@generator
def oom_tried_to_allocate(rng: random.Random) -> Variant:
    """A nearly full GPU and one more tensor: "Tried to allocate" reports the segment size, not the tensor."""
    while True:
        capacity = rng.choice((1, 2, 4))
        free_mib = rng.randrange(4, 20, 2)
        weights_mib = capacity * 1024 - free_mib
        # mostly requests that get their own segment, so that "20" is not a safe guess; sometimes the 20 MiB case
        if rng.random() < 0.25:
            n = rng.randrange(MiB + 200_000, 10 * MiB - 200_000)  # a 20 MiB segment, more than the device has
        else:
            n = rng.randrange((free_mib + 3) * MiB, 700 * MiB)  # its own segment, rounded up to 2 MiB
        alloc = _fresh(f"{capacity}GiB")
        alloc.malloc(weights_mib * MiB)
        try:
            alloc.malloc(n)
        except OutOfMemoryError as e:
            answer = e.report.alloc_size / MiB
        else:  # cannot happen with the ranges above; fail loudly rather than ask a question without an answer
            raise AssertionError(f"oom_tried_to_allocate: {n} bytes fitted on a {capacity} GiB GPU")
        wrong = {"the tensor's own size": round(n / MiB, 2), "the free memory it lacked": float(free_mib),
                 "always 20 MiB": 20.0}
        if distinct(answer, wrong, gap=0.004) or answer == 20.0:
            wrong = {k: v for k, v in wrong.items() if v != answer}
            if distinct(answer, wrong, gap=0.004):
                break
    params = {"capacity": str(capacity), "weights": str(weights_mib), "free": str(free_mib), "n": str(n),
              "n_mib": f"{n / MiB:.2f}"}
    return Variant(params, answer, wrong=wrong)


@generator
def summary_reserved_unallocated(rng: random.Random) -> Variant:
    """Read reserved - allocated off memory_summary() (in KiB below 768 MiB, as PyTorch prints it)."""
    while True:
        sizes = [rng.randint(2, 60) for _ in range(rng.randint(5, 8))]
        freed = rng.sample(range(len(sizes)), rng.randint(1, len(sizes) - 2))
        alloc = _fresh()
        ptrs = [alloc.malloc(s * MiB) for s in sizes]
        for i in sorted(freed):
            alloc.free(ptrs[i])
        gap = alloc.memory_reserved() - alloc.memory_allocated()
        wrong = {"the reserved row itself": alloc.memory_reserved() / MiB,
                 "the allocated row": alloc.memory_allocated() / MiB}
        if gap > 0 and distinct(gap / MiB, wrong):
            break
    return Variant({}, gap / MiB, alloc.memory_summary(abbreviated=True), wrong)


@generator
def empty_cache_released(rng: random.Random) -> Variant:
    """Mixed tensors, some freed: empty_cache returns only the segments with no live block left."""
    while True:
        medium = [rng.randint(2, 9) for _ in range(rng.randint(3, 6))]
        large = [rng.randint(12, 80) for _ in range(rng.randint(2, 3))]
        names = [f"m{i}" for i in range(len(medium))] + [f"g{i}" for i in range(len(large))]
        sizes = medium + large
        freed = sorted(rng.sample(names, rng.randint(2, len(names) - 1)), key=names.index)
        alloc = _fresh()
        ptrs = {name: alloc.malloc(size * MiB) for name, size in zip(names, sizes, strict=True)}
        for name in freed:
            alloc.free(ptrs[name])
        before = alloc.memory_reserved()
        cached_free = (before - alloc.memory_allocated()) / MiB
        alloc.empty_cache()
        answer = (before - alloc.memory_reserved()) / MiB
        size_of = dict(zip(names, sizes, strict=True))
        wrong = {"every freed tensor's size": float(sum(size_of[n] for n in freed)),
                 "all cached free memory, split segments too": cached_free}
        if distinct(answer, wrong):
            break
    tensors = ", ".join(f"{name} ({size} MiB)" for name, size in zip(names, sizes, strict=True))
    return Variant({"tensors": tensors, "freed": ", ".join(freed)}, answer, wrong=wrong)


@generator
def fragmented_total_free(rng: random.Random) -> Variant:
    """The "5 GB free, 2 GB fails" shape, scaled down: add the device's free memory and the cached holes."""
    while True:
        capacity = rng.choice((2, 4))
        seg = rng.randrange(200, 600, 2)
        count = rng.randint(3, min(8, (capacity * 1024 - 100) // seg))
        keep = rng.randint(seg // 2 + 2, seg - 60)  # more than half: each kept tensor lands in its own segment
        device_free = capacity * 1024 - count * seg
        largest = max(seg - keep, device_free)
        total = device_free + count * (seg - keep)
        if total - largest < 40:
            continue
        request = rng.randint(largest + 10, total - 10)
        alloc = _fresh(f"{capacity}GiB")
        big = [alloc.malloc(seg * MiB) for _ in range(count)]
        for p in big:
            alloc.free(p)
        for _ in range(count):
            alloc.malloc(keep * MiB)
        try:
            alloc.malloc(request * MiB)
        except OutOfMemoryError as e:
            report = e.report
        else:
            continue
        answer = (report.device_free + report.reserved_unallocated) / GiB
        wrong = {"only what the device has free": report.device_free / GiB,
                 "only the cache's free memory": report.reserved_unallocated / GiB}
        if distinct(answer, wrong, gap=0.05):
            break
    params = {"capacity": str(capacity), "request": str(request)}
    return Variant(params, answer, report.pytorch_message(), wrong)  # PyTorch's words, without minialloc's extra line


# -- chapter 4: paging ------------------------------------------------------------------------------------------

def _blocks_in_use(m: BlockManager) -> int:
    return len(m.blocks) - m.num_free_blocks


@generator
def paged_fork_blocks(rng: random.Random) -> Variant:
    """Parallel sampling: the prompt's blocks are shared, the partly filled last block is copied on write."""
    while True:
        prompt = rng.randint(20, 200)
        samples = rng.randint(2, 4)
        generated = rng.randint(1, 40)
        m = BlockManager(num_blocks=4096, block_size=BLOCK_TOKENS)
        m.allocate(0, list(range(prompt)))
        for s in range(1, samples):
            m.fork(0, s)
        for step in range(generated):  # one token per sample per decoding step, as a server runs them
            for s in range(samples):
                m.append_token(s, 100_000 + 1000 * s + step)
        answer = _blocks_in_use(m)
        own = -(-(prompt + generated) // BLOCK_TOKENS)
        wrong = {"no sharing: every sample holds all its blocks": float(samples * own),
                 "the fork copies the prompt's blocks": float(samples * own),
                 "only one copy: the writer's": float(own + (own - prompt // BLOCK_TOKENS))}
        wrong.pop("the fork copies the prompt's blocks")  # the same number as no sharing: one misconception
        if distinct(answer, wrong):
            break
    params = {"prompt": str(prompt), "samples": str(samples), "generated": str(generated)}
    return Variant(params, answer, wrong=wrong)


@generator
def paged_prefix_blocks(rng: random.Random) -> Variant:
    """Prefix caching shares the FULL blocks of a common system prompt, and nothing past it."""
    while True:
        system = rng.randint(20, 300)
        users = [rng.randint(5, 100) for _ in range(rng.randint(2, 4))]
        m = BlockManager(num_blocks=4096, block_size=BLOCK_TOKENS, enable_prefix_caching=True)
        shared = list(range(system))
        for r, n in enumerate(users):
            # each request's own tokens differ from its first token on, so only the system prompt can be shared
            m.allocate(r, shared + [10_000 * (r + 1) + i for i in range(n)])
        answer = _blocks_in_use(m)
        alone = sum(-(-(system + u) // BLOCK_TOKENS) for u in users)
        wrong = {"no sharing without a fork": float(alone),
                 "the partly filled block shared too": float(alone - (len(users) - 1) * -(-system // BLOCK_TOKENS))}
        if distinct(answer, wrong):
            break
    params = {"system": str(system), "requests": str(len(users)), "users": ", ".join(map(str, users))}
    return Variant(params, answer, wrong=wrong)


@generator
def paged_slots(rng: random.Random) -> Variant:
    """Paging reserves whole 16-token blocks; a contiguous cache reserves the maximum length per request."""
    while True:
        max_len = rng.choice((512, 1024, 2048))
        lengths = [rng.randint(1, max_len) for _ in range(rng.randint(3, 6))]
        m = BlockManager(num_blocks=4096, block_size=BLOCK_TOKENS, enable_prefix_caching=False)  # nothing shared
        for r, n in enumerate(lengths):
            m.allocate(r, list(range(n)))
        slots = _blocks_in_use(m) * BLOCK_TOKENS
        contiguous = max_len * len(lengths)
        wrong = {"the contiguous reservation": float(contiguous), "exactly the tokens, no last-block waste":
                 float(sum(lengths)), "the blocks, not their slots": float(_blocks_in_use(m))}
        if distinct(slots, wrong):
            break
    params = {"max_len": str(max_len), "lengths": ", ".join(map(str, lengths)), "contiguous": str(contiguous),
              "tokens": str(sum(lengths))}
    return Variant(params, slots, wrong=wrong)
