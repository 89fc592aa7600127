"""A memory report laid out exactly like torch.cuda.memory_summary(), from a torch.cuda.memory_stats() dict.

The table is the same 75 columns as PyTorch's (torch/cuda/memory.py, memory_summary and its helpers
_format_size/_format_count), row for row and space for space, so a student can put minialloc's report beside
the one their GPU prints and compare them line by line. The title is PyTorch's too ("PyTorch CUDA memory summary,
device ID N"): the report is identical to PyTorch 2.13's for the same memory_stats(), title included.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

WIDTH = 75  # characters inside the | borders

_TITLE = "PyTorch CUDA memory summary, device ID "  # torch/cuda/memory.py memory_summary
_COLUMNS = ("current", "peak", "allocated", "freed")  # Cur Usage, Peak Usage, Tot Alloc, Tot Freed
_POOL_ROWS = (("all", None), ("large_pool", "      from large pool"), ("small_pool", "      from small pool"))

_BYTE_UNITS = ("B  ", "KiB", "MiB", "GiB", "TiB", "PiB")
_COUNT_UNITS = (" ", "K", "M")


def _unit_index(scale_by: int, base: int, switch_at: int, n_units: int) -> int:
    """How many times to divide by `base`: step up while the value reaches `switch_at` of the current unit.

    Like PyTorch, compare a true (float) quotient, so the unit flips at exactly the same value.
    """
    index = 0
    while index + 1 < n_units and scale_by / base**index >= switch_at:
        index += 1
    return index


def _format_bytes(n: int, scale_by: int) -> str:
    # A unit is kept until the value reaches 768 Ki of it (786432 B -> "768 KiB"): the number fits 6 digits.
    unit = _unit_index(scale_by, 1024, 768 * 1024, len(_BYTE_UNITS))
    return f"{n // 1024**unit:6d} {_BYTE_UNITS[unit]}"  # floor division: PyTorch truncates, never rounds


def _format_count(n: int, scale_by: int) -> str:
    # Counts switch to K at 750 000 and to M at 750 000 K; M is the last unit.
    unit = _unit_index(scale_by, 1000, 750 * 1000, len(_COUNT_UNITS))
    return f"{n // 1000**unit:7d} {_COUNT_UNITS[unit]} "


Formatter = Callable[[int, int], str]

# (stats key, row label, formatter) for the groups split by pool, in PyTorch's order.
_POOL_METRICS: tuple[tuple[str, str, Formatter], ...] = (
    ("allocated_bytes", "Allocated memory", _format_bytes),
    ("active_bytes", "Active memory", _format_bytes),
    ("requested_bytes", "Requested memory", _format_bytes),
    ("reserved_bytes", "GPU reserved memory", _format_bytes),
    ("inactive_split_bytes", "Non-releasable memory", _format_bytes),
    ("allocation", "Allocations", _format_count),
    ("active", "Active allocs", _format_count),
    ("segment", "GPU reserved segments", _format_count),
    ("inactive_split", "Non-releasable allocs", _format_count),
)
# Oversize stats have no pools (keys like "oversize_allocations.current").
_OVERSIZE_METRICS = (
    ("oversize_allocations", "Oversize allocations"),
    ("oversize_segments", "Oversize GPU segments"),
)

# Every key memory_summary reads; other keys (max_split_size, num_device_alloc, ...) are ignored.
SUMMARY_KEYS: tuple[str, ...] = (
    "num_ooms",
    "num_alloc_retries",
    *(f"{metric}.{pool}.{col}" for metric, *_ in _POOL_METRICS for pool, _ in _POOL_ROWS for col in _COLUMNS),
    *(f"{metric}.{col}" for metric, _ in _OVERSIZE_METRICS for col in _COLUMNS),
)


def _title_line(device: int, title: str = _TITLE) -> str:
    # PyTorch pads its title so that with a one-digit device ID it sits mid-line (18 spaces before, 17 after).
    # Longer IDs push into the right-hand padding, as there.
    left = (WIDTH - len(title)) // 2
    return f"{'':{left}}{title}{device:<{WIDTH - left - len(title)}d}"


def _row(label: str, cells: list[str]) -> str:
    return f" {label:<21} | " + " | ".join(cells) + " "


def memory_summary(stats: Mapping[str, int], device: int = 0, abbreviated: bool = False) -> str:
    """Render `stats` (torch.cuda.memory_stats()'s flat keys) as torch.cuda.memory_summary() would.

    abbreviated=True keeps only the "all" row of each group, as in PyTorch. A missing key raises KeyError
    naming it; all of SUMMARY_KEYS are required even when abbreviated, so one dict passes or fails both ways.
    """
    missing = [key for key in SUMMARY_KEYS if key not in stats]
    if missing:
        raise KeyError(
            f"memory_summary: stats has no key {missing[0]!r}"
            + (f" (nor {len(missing) - 1} other keys)" if len(missing) > 1 else "")
            + "; it needs every key in minialloc.summary.SUMMARY_KEYS, as torch.cuda.memory_stats() has"
        )

    ooms, retries = stats["num_ooms"], stats["num_alloc_retries"]
    thick, thin = "=" * WIDTH, "-" * WIDTH
    lines = [
        thick,
        _title_line(device),
        thin,
        f"{'':12}CUDA OOMs: {ooms:<12d} |{'':8}cudaMalloc retries: {retries:<8d}  ",
        thick,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]
    for metric, label, fmt in _POOL_METRICS:
        lines.append(thin)
        # Each column's unit comes from the "all" row, so the pool rows below it read in the same unit.
        scale = [stats[f"{metric}.all.{col}"] for col in _COLUMNS]
        for pool, pool_label in _POOL_ROWS[:1] if abbreviated else _POOL_ROWS:
            values = [stats[f"{metric}.{pool}.{col}"] for col in _COLUMNS]
            lines.append(_row(pool_label or label, [fmt(v, s) for v, s in zip(values, scale, strict=True)]))
    for metric, label in _OVERSIZE_METRICS:
        lines.append(thin)
        values = [stats[f"{metric}.{col}"] for col in _COLUMNS]
        # No "all" row here, so each value picks its own unit.
        lines.append(_row(label, [_format_count(v, v) for v in values]))
    lines.append(thick)
    return "".join(f"|{line}|\n" for line in lines)
