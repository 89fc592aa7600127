"""The block-table picture of PagedAttention: each sequence's logical blocks, the physical blocks they map to.

Top: one row per sequence, its logical blocks left to right (with the tokens they hold when the blocks are
small enough to print them). Bottom: the pool of physical blocks, coloured by reference count: free, held by one
sequence, or shared by several (copy-on-write applies to these). An arrow runs from every logical block to the
physical block its table names, so a fork shows as two rows pointing at the same blocks, and a copy-on-write as
one arrow moved to a fresh block.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from ..lang import messages, say
from ._common import COLORS, new_figure

# Same palette as the segment maps: blue is "in use", green "free"; shared blocks get the reddish purple,
# which stays distinct from both under the common colour-vision deficiencies.
BLOCK_COLORS = {"free": "#FFFFFF", "owned": COLORS["live"], "shared": COLORS["pending"], "cached": "#E8E8E8"}
_SEQ_COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")

# Every word the picture writes, in English, shown in the notebook's language (minialloc.lang), chosen when it is drawn.
TEXT = messages("minialloc.viz.block_table.TEXT", {
    "physical": "physical\nblocks",
    "seq": "seq {seq}\n({n} tokens)",
    "owned": "held by one sequence",
    "shared": "shared (ref count > 1)",
    "free": "free",
    "cached": "free, still cached",
    "entry": "block table entry: logical -> physical",
})


def block_table_rows(manager: Any, seq_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """What the picture shows, as data: {"seqs": [(seq_id, table, tokens)], "ref_cnt": [...], "cached": [...]}.

    `manager` is a minialloc.paging.BlockManager. A free block whose content is still in the prefix cache is
    "cached" (a later request with the same prefix revives it without recomputing).
    """
    ids = list(manager.seqs) if seq_ids is None else list(seq_ids)
    seqs = [(sid, list(manager.seq(sid).table), list(manager.seq(sid).tokens)) for sid in ids]
    ref_cnt = [b.ref_cnt for b in manager.blocks]
    cached = [b.ref_cnt == 0 and b.block_hash is not None for b in manager.blocks]
    return {"seqs": seqs, "ref_cnt": ref_cnt, "cached": cached, "block_size": manager.block_size}


def plot_block_table(manager: Any, seq_ids: Sequence[int] | None = None, *, title: str = "",
                     show_tokens: bool | None = None, publish: bool = True) -> Figure:
    """Draw the block tables of `seq_ids` (default: every sequence) over the physical block pool.

    show_tokens: print each logical block's tokens inside it (default: when a block holds at most 4 tokens).
    """
    data = block_table_rows(manager, seq_ids)
    seqs, ref_cnt, cached, bs = data["seqs"], data["ref_cnt"], data["cached"], data["block_size"]
    n_phys = len(ref_cnt)
    if show_tokens is None:
        show_tokens = bs <= 4
    longest = max((len(t) for _, t, _ in seqs), default=0)
    width_units = max(n_phys, longest + 2)
    # Sequences alternate above and below the pool, so two sequences (a fork) never draw arrows across each
    # other's boxes; further ones stack outwards.
    above = (len(seqs) + 1) // 2
    below = len(seqs) // 2
    fig = new_figure(min(1.6 + 0.8 * width_units, 14.0), 1.5 + 1.05 * (above + below + 1), publish=publish)
    ax = fig.add_subplot()
    box_w, box_h = 0.9, 0.66

    # the physical pool, at y = 0
    for pid in range(n_phys):
        kind = "shared" if ref_cnt[pid] > 1 else "owned" if ref_cnt[pid] == 1 else "cached" if cached[pid] else "free"
        ax.add_patch(Rectangle((pid - box_w / 2, -box_h / 2), box_w, box_h, facecolor=BLOCK_COLORS[kind],
                               edgecolor="#444444", linewidth=1.0))
        ax.text(pid, 0, str(pid), ha="center", va="center", fontsize=10,
                color="white" if kind in ("owned", "shared") else "black", fontweight="bold")
        if ref_cnt[pid] > 1:
            ax.text(pid + box_w / 2 - 0.03, box_h / 2 - 0.03, f"x{ref_cnt[pid]}", ha="right", va="top",
                    fontsize=7, color="white")
    ax.text(-0.7, 0, say(TEXT, "physical"), ha="right", va="center", fontsize=9)

    # one row per sequence: its logical blocks, and an arrow from each to its physical block
    for row, (sid, table, tokens) in enumerate(seqs):
        side = 1 if row % 2 == 0 else -1
        y = side * 1.5 * (row // 2 + 1)
        colour = _SEQ_COLORS[row % len(_SEQ_COLORS)]
        ax.text(-0.7, y, say(TEXT, "seq", seq=sid, n=len(tokens)), ha="right", va="center", fontsize=9, color=colour)
        for i, pid in enumerate(table):
            x = i + 1  # logical blocks start one step right of the pool's block 0, so arrows slant visibly
            chunk = tokens[i * bs:(i + 1) * bs]
            ax.add_patch(Rectangle((x - box_w / 2, y - box_h / 2), box_w, box_h, facecolor="white",
                                   edgecolor=colour, linewidth=1.6))
            label = " ".join(str(t) for t in chunk) if show_tokens else f"{len(chunk)}/{bs}"
            ax.text(x, y + 0.08, label, ha="center", va="center", fontsize=6.5 if show_tokens else 8)
            ax.text(x, y - box_h / 2 + 0.04, f"L{i}", ha="center", va="bottom", fontsize=6, color="#666666")
            start = (x, y - side * box_h / 2)
            end = (pid, side * box_h / 2)
            ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9, color=colour,
                                         linewidth=1.0, alpha=0.85, shrinkA=1, shrinkB=2))
    ax.set_xlim(-2.4, width_units + 0.2)
    ax.set_ylim(-1.5 * below - 0.6, 1.5 * above + 0.6)
    ax.set_axis_off()
    handles = [Patch(facecolor=BLOCK_COLORS[kind], edgecolor="#444444", label=say(TEXT, kind))
               for kind in ("owned", "shared", "free")]
    handles.append(Line2D([], [], color="#444444", marker=">", label=say(TEXT, "entry")))
    if any(cached):
        handles.insert(3, Patch(facecolor=BLOCK_COLORS["cached"], edgecolor="#444444", label=say(TEXT, "cached")))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncols=2, fontsize=7, frameon=False)
    if title:
        # wrapped to the figure's width (about 0.55 em a character at 10 pt): a translated title runs longer
        width = int(fig.get_size_inches()[0] * 72 / (10 * 0.55)) - 6
        ax.set_title("\n".join(textwrap.fill(line, width) for line in title.splitlines()), loc="left", fontsize=10)
    fig.tight_layout()
    return fig
