"""Who shares the GPU: a memory budget for training a transformer, item by item, that a learner can recompute.

Before blaming fragmentation, check that the program's live memory fits at all. A training step holds:

- **weights**: the parameters, in the training dtype (bf16: 2 bytes each);
- **gradients**: one per parameter, same dtype;
- **optimizer states**: Adam keeps two moments per parameter (m and v); with mixed precision it also keeps an fp32
  master copy of the weights. The classic accounting (ZeRO, Rajbhandari et al., SC 2020, section 3.1) is
  2 + 2 + (4 + 4 + 4) = 16 bytes per parameter. (PyTorch's autocast keeps fp32 weights and fp32 gradients
  instead, 4 + 4 + 4 + 4: the same 16 bytes, split differently, plus bf16 copies of the weights it casts);
- **activations**: what the forward pass keeps for the backward pass. Per transformer layer, with 16-bit
  activations, s * b * h * (34 + 5 * a * s / h) bytes (Korthikanti et al., "Reducing Activation Recomputation in
  Large Transformer Models", MLSys 2023, section 4.1; s sequence length, b micro-batch, h hidden size, a heads).
  The 5as/h part is the attention score matrices, which a fused (Flash) attention kernel never stores. Full
  activation checkpointing keeps only each layer's input (2sbh bytes) and recomputes one layer at a time during
  backward, so one layer's full activations are live on top. The loss needs the logits: 4sbv bytes in fp32.
  The constant 34 is derived for a GPT-style layer (a 4h GELU MLP, with dropout); a Llama layer (SwiGLU MLP of
  width about 2.7h, no dropout) keeps somewhat more, so for the Llama shape below this is an estimate;
- **workspaces**: cuBLAS and cuDNN scratch space, communication buffers: an assumption here (1 GiB), measure yours;
- **the CUDA context**: the driver's own state and the loaded kernels, held before the first tensor: an assumption
  here (512 MiB; it differs by GPU, driver and CUDA version), measure yours as nvidia-smi's figure for a process
  that has only initialised CUDA.

What the usual fixes change: a smaller micro-batch scales the activations down in proportion; gradient
checkpointing replaces most of them by recomputation; offloading the optimizer moves the optimizer states (and the
fp32 master weights) to CPU memory (ZeRO-Offload also streams the gradients to the CPU as they are produced; this
budget keeps them on the GPU, so it errs high); pure bf16 training keeps Adam's moments in bf16 and has no master
copy (8 bytes per parameter in all). None of these is free: see chapter 6 of the course.

These are estimates of live memory, summed as if every item were live at once: a little pessimistic (during the
backward pass gradients appear as activations are freed), and without the optimizer step's own temporaries. The
caching allocator's own overhead (rounding, cached but unallocated memory, fragmentation) comes on top: that is
what the rest of the course is about.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .lang import messages, pick, say
from .sizes import GiB, MiB, format_size

# The budget's words on screen, in the course's languages (minialloc.lang); Budget.items keeps the English keys.
ITEM_NAMES = messages("minialloc.budget.ITEM_NAMES", {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer states": "optimizer states",
    "activations": "activations",
    "workspaces": "workspaces",
    "CUDA context": "CUDA context",
})
TEXT = messages("minialloc.budget.TEXT", {
    "heading": "{model}, micro-batch {batch} x {tokens} tokens",
    "total": "total",
    "fits": "fits in {capacity} (headroom {headroom} GiB)",
    "does_not_fit": "does NOT fit in {capacity} (headroom {headroom} GiB)",
    "the_gpu": "the GPU: {capacity}",
})


def item_name(key: str) -> str:
    """A budget item's name in the notebook's language (the key itself when it is not one of the six)."""
    return pick(ITEM_NAMES[key]) if key in ITEM_NAMES else key

__all__ = ["LLAMA_7B", "Budget", "Model", "Training", "estimate", "plot_budget"]


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer's shape: enough to count its parameters' and activations' bytes."""

    name: str
    params: int
    layers: int
    hidden: int
    heads: int
    vocab: int


# Llama 2 7B (Touvron et al., 2023): 32 layers, hidden 4096, 32 heads, vocabulary 32000, 6.74 B parameters.
LLAMA_7B = Model("7B (Llama 2 7B's shape)", 6_738_415_616, 32, 4096, 32, 32000)


@dataclass(frozen=True)
class Training:
    """How the model is trained. The defaults are the common mixed-precision Adam setup."""

    micro_batch: int = 1
    seq_len: int = 4096
    weight_bytes: int = 2  # bf16 weights and gradients
    master_weights: bool = True  # an fp32 copy of the weights for the optimizer step (mixed precision)
    adam_state_bytes: int = 4  # bytes of each of Adam's two moments: 4 (fp32) or 2 (bf16)
    checkpointing: bool = False  # full activation checkpointing: keep layer inputs, recompute the rest
    flash_attention: bool = True  # the attention scores are never stored
    offload_optimizer: bool = False  # optimizer states and master weights live in CPU memory
    workspace: int = 1 * GiB  # assumption: cuBLAS/cuDNN workspaces and communication buffers
    cuda_context: int = 512 * MiB  # assumption: differs by GPU, driver and CUDA version


@dataclass(frozen=True)
class Budget:
    """The bytes each user of the GPU holds at the peak of a training step, in the order they arrive."""

    model: Model
    training: Training
    items: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.items.values())

    def fits(self, capacity: int) -> bool:
        return self.total <= capacity

    def table(self, capacity: int | None = None) -> str:
        """The budget as aligned text, with GiB everywhere (one unit makes the rows comparable)."""
        names = {key: item_name(key) for key in self.items}
        total = say(TEXT, "total")
        width = max(len(n) for n in [*names.values(), total])
        lines = [say(TEXT, "heading", model=self.model.name, batch=self.training.micro_batch,
                     tokens=self.training.seq_len)]
        for key, nbytes in self.items.items():
            lines.append(f"  {names[key]:<{width}}  {nbytes / GiB:8.2f} GiB")
        lines.append(f"  {total:<{width}}  {self.total / GiB:8.2f} GiB")
        if capacity is not None:
            verdict = "fits" if self.fits(capacity) else "does_not_fit"
            lines.append("  " + say(TEXT, verdict, capacity=format_size(capacity),
                                    headroom=f"{(capacity - self.total) / GiB:+.2f}"))
        return "\n".join(lines)


def optimizer_bytes_per_param(t: Training) -> int:
    """Adam's two moments, plus the fp32 master weights in mixed precision."""
    return 2 * t.adam_state_bytes + (4 if t.master_weights else 0)


def activation_bytes(m: Model, t: Training) -> int:
    """Activations kept for backward at the peak (Korthikanti et al. 2023, section 4.1), plus the fp32 logits."""
    s, b, h, a = t.seq_len, t.micro_batch, m.hidden, m.heads
    full_layer = s * b * h * 34 + (0 if t.flash_attention else 5 * a * s * s * b)
    if t.checkpointing:
        # each layer's input is kept; during backward one layer is recomputed and its activations are live
        layers = m.layers * 2 * s * b * h + full_layer
    else:
        layers = m.layers * full_layer
    return layers + 4 * s * b * m.vocab


def estimate(model: Model = LLAMA_7B, training: Training | None = None, **changes: Any) -> Budget:
    """The budget of one training step: `estimate(LLAMA_7B, micro_batch=2, checkpointing=True)`."""
    t = replace(training or Training(), **changes)
    if t.micro_batch < 1 or t.seq_len < 1:
        raise ValueError(f"micro_batch and seq_len must be at least 1, got {t.micro_batch} and {t.seq_len}")
    if t.adam_state_bytes not in (2, 4) or t.weight_bytes not in (2, 4):
        raise ValueError("weight_bytes and adam_state_bytes are 2 (bf16/fp16) or 4 (fp32)")
    p = model.params
    items = {
        "weights": p * t.weight_bytes,
        "gradients": p * t.weight_bytes,
        "optimizer states": 0 if t.offload_optimizer else p * optimizer_bytes_per_param(t),
        "activations": activation_bytes(model, t),
        "workspaces": t.workspace,
        "CUDA context": t.cuda_context,
    }
    return Budget(model, t, items)


_COLOURS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer states": "#c44e52", "activations": "#dd8452",
            "workspaces": "#8172b3", "CUDA context": "#937860"}


def plot_budget(budgets: Sequence[tuple[str, Budget]], capacity: int, ax: Any = None, title: str = "") -> Any:
    """Stacked bars, one per (label, budget), against the GPU's capacity as a line. Returns the axes."""
    if ax is None:
        from .viz._common import new_figure  # shows once in a notebook, like the course's other pictures

        ax = new_figure(9, 1.6 + 0.75 * len(budgets)).add_subplot()
    labels = [label for label, _ in budgets]
    for row, (_, b) in enumerate(budgets):
        left = 0.0
        for name, nbytes in b.items.items():
            width = nbytes / GiB
            ax.barh(row, width, left=left, color=_COLOURS.get(name, "#999999"), edgecolor="white",
                    label=item_name(name) if row == 0 else None)
            if width >= 4:  # label the parts wide enough to hold their number
                ax.text(left + width / 2, row, f"{width:.0f}", ha="center", va="center", color="white", fontsize=8)
            left += width
        ax.text(left + 1, row, f"{left:.1f} GiB", va="center", fontsize=9)
    ax.axvline(capacity / GiB, color="black", linestyle="--", linewidth=1.2)
    # just above the plot area, in data x and axes y, so it never sits on a bar
    ax.text(capacity / GiB, 1.01, say(TEXT, "the_gpu", capacity=format_size(capacity)), fontsize=9, ha="center",
            va="bottom",
            transform=ax.get_xaxis_transform())
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("GiB")
    most = max(max(b.total for _, b in budgets), capacity) / GiB
    ax.set_xlim(0, most * 1.18)
    ax.legend(loc="upper center", fontsize=8, ncols=6, frameon=False, bbox_to_anchor=(0.5, -0.28))
    if title:
        ax.set_title(title, loc="left", pad=18)
    ax.figure.tight_layout()
    return ax
