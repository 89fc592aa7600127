"""The allocator's counters, with the same names and meanings as torch.cuda.memory_stats().

Each statistic is tracked four ways (current, peak, allocated = total ever added, freed = total ever removed), for
three "stat types": all, small_pool and large_pool. These mirror DeviceStats, Stat, increase_stat and
decrease_stat in c10/core/CachingDeviceAllocator.h and CUDACachingAllocator.cpp.

PyTorch updates twelve numbers per statistic. Every malloc and free touches five statistics, so minialloc stores
less and derives the rest, with the same results: "all" is the sum of the two pools (only its peak has to be
followed as it happens), and freed = allocated - current (plus what was current when the totals were last reset).
"""

from __future__ import annotations

ARRAY_STATS = (
    "allocation",  # number of allocated blocks
    "segment",  # number of segments from device malloc
    "active",  # allocated blocks plus those freed but waiting on other streams
    "inactive_split",  # free pieces of split segments (memory that empty_cache cannot release)
    "allocated_bytes",
    "reserved_bytes",  # bytes held from the device: what nvidia-smi shows for the process, minus the context
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",  # bytes the program asked for, before rounding
)
STAT_TYPES = ("all", "small_pool", "large_pool")
FIELDS = ("current", "peak", "allocated", "freed")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")


class Stat:
    """One statistic: current value, its peak, and the running totals added and removed."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def increase(self, amount: int) -> None:  # increase_stat
        self.current += amount
        if self.current > self.peak:
            self.peak = self.current
        self.allocated += amount

    def decrease(self, amount: int) -> None:  # decrease_stat
        self.current -= amount
        self.freed += amount

    def reset_peak(self) -> None:
        self.peak = self.current

    def reset_accumulated(self) -> None:
        self.allocated = self.freed = 0

    def values(self) -> tuple[int, int, int, int]:
        return self.current, self.peak, self.allocated, self.freed


class PoolStat:
    """One statistic for the small pool (index 0) and the large pool (index 1), and their sum, "all"."""

    __slots__ = ("current", "allocated", "peak", "base", "all_peak")

    def __init__(self) -> None:
        self.current = [0, 0]
        self.allocated = [0, 0]
        self.peak = [0, 0]
        self.base = [0, 0]  # current when the totals were last reset: freed = base + allocated - current
        self.all_peak = 0

    def increase(self, k: int, amount: int) -> None:
        cur = self.current
        c = cur[k] = cur[k] + amount
        self.allocated[k] += amount
        if c > self.peak[k]:
            self.peak[k] = c
        total = cur[0] + cur[1]
        if total > self.all_peak:
            self.all_peak = total

    def decrease(self, k: int, amount: int) -> None:
        self.current[k] -= amount  # freed follows from it

    def values(self, t: int) -> tuple[int, int, int, int]:
        """(current, peak, allocated, freed) for stat type t: 0 all, 1 small_pool, 2 large_pool."""
        if t:
            k = t - 1
            cur, alloc = self.current[k], self.allocated[k]
            return cur, self.peak[k], alloc, self.base[k] + alloc - cur
        cur, alloc = sum(self.current), sum(self.allocated)
        return cur, self.all_peak, alloc, sum(self.base) + alloc - cur

    def reset_peak(self) -> None:
        self.peak = list(self.current)
        self.all_peak = sum(self.current)

    def reset_accumulated(self) -> None:
        self.allocated = [0, 0]
        self.base = list(self.current)


class DeviceStats:
    """All counters of one device. Pool arguments: is_small True for the small pool, False for the large one."""

    def __init__(self) -> None:
        self.arrays: dict[str, PoolStat] = {name: PoolStat() for name in ARRAY_STATS}
        for name, stat in self.arrays.items():
            setattr(self, name, stat)  # self.allocated_bytes etc., for the hot paths below
        self.oversize_allocations = Stat()
        self.oversize_segments = Stat()
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    def increase(self, name: str, is_small: bool, amount: int) -> None:
        self.arrays[name].increase(0 if is_small else 1, amount)

    def decrease(self, name: str, is_small: bool, amount: int) -> None:
        self.arrays[name].decrease(0 if is_small else 1, amount)

    # The three updates of every malloc and free, written out: they run millions of times in a replay.
    def block_allocated(self, is_small: bool, size: int, requested: int) -> None:
        """alloc_found_block: allocation, allocated_bytes, active, active_bytes, requested_bytes go up."""
        k = 0 if is_small else 1
        self.allocation.increase(k, 1)
        self.allocated_bytes.increase(k, size)
        self.active.increase(k, 1)
        self.active_bytes.increase(k, size)
        self.requested_bytes.increase(k, requested)

    def free_requested(self, is_small: bool, size: int) -> None:
        """free: allocation and allocated_bytes drop at once, even if the block waits for other streams."""
        k = 0 if is_small else 1
        self.allocation.current[k] -= 1
        self.allocated_bytes.current[k] -= size

    def free_completed(self, is_small: bool, size: int, requested: int) -> None:
        """free_block: active, active_bytes and requested_bytes drop when the block is back in the pool."""
        k = 0 if is_small else 1
        self.active.current[k] -= 1
        self.active_bytes.current[k] -= size
        self.requested_bytes.current[k] -= requested

    def current(self, name: str) -> int:
        return sum(self.arrays[name].current)

    def peak(self, name: str) -> int:
        return self.arrays[name].all_peak

    def _all(self) -> list[Stat | PoolStat]:
        return [*self.arrays.values(), self.oversize_allocations, self.oversize_segments]

    def reset_peak(self) -> None:
        for s in self._all():
            s.reset_peak()

    def reset_accumulated(self) -> None:
        for s in self._all():
            s.reset_accumulated()
        for name in COUNTERS:
            setattr(self, name, 0)

    def as_dict(self, max_split_size: int) -> dict[str, int]:
        """The flat, sorted dict torch.cuda.memory_stats() returns ("allocated_bytes.all.peak": ...).
        max_split_size is the allocator's stats.max_split_size: the setting when it was created, -1 if unset."""
        out: dict[str, int] = {}
        for name, stat in self.arrays.items():
            for t, type_name in enumerate(STAT_TYPES):
                for field, value in zip(FIELDS, stat.values(t), strict=True):
                    out[f"{name}.{type_name}.{field}"] = value
        for name in ("oversize_allocations", "oversize_segments"):
            for field, value in zip(FIELDS, getattr(self, name).values(), strict=True):
                out[f"{name}.{field}"] = value
        for name in COUNTERS:
            out[name] = getattr(self, name)
        out["max_split_size"] = max_split_size
        return dict(sorted(out.items()))
