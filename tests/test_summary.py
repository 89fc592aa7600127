"""minialloc.summary.memory_summary, checked character for character against torch.cuda.memory_summary."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from unittest import mock

import pytest

from minialloc.sizes import GiB, KiB, MiB
from minialloc.summary import SUMMARY_KEYS, _title_line, memory_summary

TiB = 1024 * GiB
PiB = 1024 * TiB

# Every key torch.cuda.memory_stats() returns when no private pool exists (see its docstring in torch).
POOL_STATS = (
    "allocation", "segment", "active", "inactive_split",
    "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
)
POOLS = ("all", "large_pool", "small_pool")
COLUMNS = ("current", "peak", "allocated", "freed")
SCALARS = (
    "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
    "num_oom_rejections", "max_split_size",
)
PYTORCH_TITLE = "PyTorch CUDA memory summary, device ID "


def make_stats(values: dict[str, int] | None = None) -> dict[str, int]:
    """A full memory_stats() dict: zeros, max_split_size -1 (PyTorch's "unset"), then `values` on top."""
    stats = {f"{metric}.{pool}.{col}": 0 for metric in POOL_STATS for pool in POOLS for col in COLUMNS}
    stats |= {f"oversize_{kind}.{col}": 0 for kind in ("allocations", "segments") for col in COLUMNS}
    stats |= dict.fromkeys(SCALARS, 0)
    stats["max_split_size"] = -1
    for key, value in (values or {}).items():
        assert key in stats, f"not a memory_stats() key: {key}"  # a typo here would silently test nothing
        stats[key] = value
    return stats


def realistic_stats() -> dict[str, int]:
    """A training process: big activations in the large pool, many small tensors in the small pool."""
    values = {"num_ooms": 3, "num_alloc_retries": 41, "max_split_size": 200 * MiB, "num_device_alloc": 97}

    def pools(metric: str, large: tuple[int, int, int], small: tuple[int, int, int]) -> None:
        # (current, peak, allocated) per pool; freed = allocated - current, and "all" adds the two pools.
        for pool, (current, peak, allocated) in (("large_pool", large), ("small_pool", small)):
            for col, value in zip(COLUMNS, (current, peak, allocated, allocated - current), strict=True):
                values[f"{metric}.{pool}.{col}"] = value
                values[f"{metric}.all.{col}"] = values.get(f"{metric}.all.{col}", 0) + value

    pools("allocated_bytes", (3 * GiB + 512 * MiB, 5 * GiB, 812 * GiB), (37 * MiB + 5, 64 * MiB, 3 * GiB))
    pools("active_bytes", (3 * GiB + 600 * MiB, 5 * GiB + 1, 812 * GiB), (38 * MiB, 65 * MiB, 3 * GiB + 99))
    pools("requested_bytes", (3 * GiB + 500 * MiB, 5 * GiB - 7, 800 * GiB), (30 * MiB + 3, 60 * MiB, 2 * GiB))
    pools("reserved_bytes", (4 * GiB, 6 * GiB, 40 * GiB), (40 * MiB, 66 * MiB, 200 * MiB))
    pools("inactive_split_bytes", (300 * MiB, 900 * MiB, 2 * TiB), (700 * KiB, 3 * MiB, 9 * GiB))
    pools("allocation", (850, 1200, 2_400_000), (12_000, 15_000, 90_000_000))
    pools("active", (860, 1210, 2_400_000), (12_010, 15_020, 90_000_000))
    pools("segment", (40, 55, 300), (20, 33, 100))
    pools("inactive_split", (12, 40, 800_000), (7, 9, 5_000_000))
    for col, allocs, segments in zip(COLUMNS, (2, 3, 120, 118), (2, 3, 17, 15), strict=True):
        values[f"oversize_allocations.{col}"] = allocs
        values[f"oversize_segments.{col}"] = segments
    stats = make_stats(values)
    stats["reserved_bytes_by_private_pools.0_1.all.current"] = 20 * MiB  # extra keys must be ignored
    return stats


def huge_stats() -> dict[str, int]:
    """GiB to PiB and K to M, including numbers too wide for their column (PyTorch lets them overflow)."""
    sizes = [5 * GiB, 900 * GiB, 3 * TiB + 1, 800 * TiB, 2 * PiB, 5000 * PiB, 10**22, 10**9 * PiB]
    counts = [999_999, 10**6, 7 * 10**8, 10**12, 10**14]
    values = {}
    for i, key in enumerate(sorted(SUMMARY_KEYS)):
        pick = sizes if key.split(".")[0].endswith("bytes") else counts
        values[key] = pick[i % len(pick)]
    return make_stats(values)


def unit_edge_stats() -> dict[str, int]:
    """Values on and beside every point where PyTorch changes unit, spread over all keys."""
    edges = [768 * 1024**k for k in range(1, 6)] + [750 * 1000**k for k in range(1, 3)]
    values = [edge + delta for edge in edges for delta in (-1, 0, 1)]
    return make_stats({key: values[i % len(values)] for i, key in enumerate(sorted(SUMMARY_KEYS))})


def random_stats(seed: int) -> dict[str, int]:
    rng = random.Random(seed)  # seeded, so a failure is reproducible
    return make_stats({key: rng.randrange(2 ** rng.randrange(1, 62)) for key in SUMMARY_KEYS})


CASES: dict[str, Callable[[], dict[str, int]]] = {
    "zeros": make_stats,
    "realistic": realistic_stats,
    "huge": huge_stats,
    "unit_edges": unit_edge_stats,
    **{f"random{seed}": (lambda seed=seed: random_stats(seed)) for seed in range(10)},
}


def torch_summary(stats: dict[str, int], device: int, abbreviated: bool) -> str:
    torch = pytest.importorskip("torch")
    # torch's memory_summary takes every number from the module-level memory_stats(), which returns {} with
    # no GPU; an int device passes _get_device_index untouched, so this one patch lets it run on a CPU.
    with mock.patch("torch.cuda.memory.memory_stats", return_value=stats) as fake:
        text = torch.cuda.memory_summary(device=device, abbreviated=abbreviated)
    fake.assert_called_once_with(device=device)
    return text


@pytest.mark.parametrize("abbreviated", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_same_text_as_pytorch(case: str, abbreviated: bool) -> None:
    stats = CASES[case]()
    # every character, the title included (issue 15: PyTorch 2.13's title line too)
    assert memory_summary(stats, abbreviated=abbreviated) == torch_summary(stats, 0, abbreviated)


@pytest.mark.parametrize("device", [0, 3, 12, 12345])
def test_device_id_in_title(device: int) -> None:
    stats = realistic_stats()
    assert memory_summary(stats, device=device) == torch_summary(stats, device, False)


@pytest.mark.parametrize("device", [0, 7, 42, 10**16])
def test_title_centred_by_pytorchs_rule(device: int) -> None:
    # Our title rule, given PyTorch's title text, must rebuild PyTorch's title line.
    torch_line = torch_summary(make_stats(), device, True).split("\n")[1]
    assert f"|{_title_line(device, PYTORCH_TITLE)}|" == torch_line


def test_title_is_pytorchs() -> None:
    # Readable without torch: PyTorch's title line, 18 spaces before and 17 after a one-digit device ID.
    title = memory_summary(make_stats()).split("\n")[1]
    assert title == f"|{'':18}{PYTORCH_TITLE}0{'':17}|"


def test_pool_rows_use_the_all_rows_unit() -> None:
    # Readable without torch: 1.5 GiB is under 768 GiB, so the group reads in MiB, and the small pool's
    # 300 KiB truncates to 0 MiB rather than switching unit.
    stats = make_stats({
        "allocated_bytes.all.current": 1536 * MiB,
        "allocated_bytes.large_pool.current": 1536 * MiB - 300 * KiB,
        "allocated_bytes.small_pool.current": 300 * KiB,
    })
    lines = memory_summary(stats).split("\n")
    start = lines.index("| Allocated memory      |   1536 MiB |      0 B   |      0 B   |      0 B   |")
    assert lines[start + 1:start + 3] == [
        "|       from large pool |   1535 MiB |      0 B   |      0 B   |      0 B   |",
        "|       from small pool |      0 MiB |      0 B   |      0 B   |      0 B   |",
    ]


def test_summary_keys_are_memory_stats_keys() -> None:
    assert set(SUMMARY_KEYS) <= set(make_stats())
    assert len(SUMMARY_KEYS) == len(set(SUMMARY_KEYS)) == 2 + 9 * 3 * 4 + 2 * 4


@pytest.mark.parametrize("abbreviated", [False, True])
@pytest.mark.parametrize("key", ["num_ooms", "inactive_split.small_pool.freed", "oversize_segments.peak"])
def test_missing_key_is_named(key: str, abbreviated: bool) -> None:
    stats = make_stats()
    del stats[key]
    with pytest.raises(KeyError, match=re.escape(repr(key))):
        memory_summary(stats, abbreviated=abbreviated)


def test_empty_dict_names_first_key_and_count() -> None:
    with pytest.raises(KeyError, match=r"no key 'num_ooms' \(nor 117 other keys\)"):
        memory_summary({})
