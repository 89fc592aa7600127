"""The allocator's counters, with the same names and meanings as torch.cuda.memory_stats().

Each statistic is tracked four ways (current, peak, allocated = total ever added, freed = total ever removed), for
three "stat types": all, small_pool and large_pool. These mirror DeviceStats, Stat, increase_stat and
decrease_stat in c10/core/CachingDeviceAllocator.h and CUDACachingAllocator.cpp.
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


class DeviceStats:
    """All counters of one device. `arrays[name]` is a pair (all, pool) lookup: use `pair(name, is_small)`."""

    def __init__(self) -> None:
        self.arrays: dict[str, tuple[Stat, Stat, Stat]] = {name: (Stat(), Stat(), Stat()) for name in ARRAY_STATS}
        self.oversize_allocations = Stat()
        self.oversize_segments = Stat()
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    def pair(self, name: str, is_small: bool) -> tuple[Stat, Stat]:
        """The 'all' stat and the pool's stat: every update touches both (get_stat_types_for_pool)."""
        arr = self.arrays[name]
        return arr[0], arr[1] if is_small else arr[2]

    def increase(self, name: str, is_small: bool, amount: int) -> None:
        arr = self.arrays[name]
        arr[0].increase(amount)
        (arr[1] if is_small else arr[2]).increase(amount)

    def decrease(self, name: str, is_small: bool, amount: int) -> None:
        arr = self.arrays[name]
        arr[0].decrease(amount)
        (arr[1] if is_small else arr[2]).decrease(amount)

    # The three updates of every malloc and free, written out: they run millions of times in a replay, and a
    # call per statistic would double the allocator's cost. Each touches the "all" stat and the pool's.
    def block_allocated(self, is_small: bool, size: int, requested: int) -> None:
        """alloc_found_block: allocation, allocated_bytes, active, active_bytes, requested_bytes go up."""
        k = 1 if is_small else 2
        a = self.arrays
        for arr, amount in ((a["allocation"], 1), (a["allocated_bytes"], size), (a["active"], 1),
                            (a["active_bytes"], size), (a["requested_bytes"], requested)):
            for s in (arr[0], arr[k]):
                c = s.current + amount
                s.current = c
                if c > s.peak:
                    s.peak = c
                s.allocated += amount

    def free_requested(self, is_small: bool, size: int) -> None:
        """free: allocation and allocated_bytes drop at once, even if the block waits for other streams."""
        k = 1 if is_small else 2
        a = self.arrays
        for arr, amount in ((a["allocation"], 1), (a["allocated_bytes"], size)):
            for s in (arr[0], arr[k]):
                s.current -= amount
                s.freed += amount

    def free_completed(self, is_small: bool, size: int, requested: int) -> None:
        """free_block: active, active_bytes and requested_bytes drop when the block is back in the pool."""
        k = 1 if is_small else 2
        a = self.arrays
        for arr, amount in ((a["active"], 1), (a["active_bytes"], size), (a["requested_bytes"], requested)):
            for s in (arr[0], arr[k]):
                s.current -= amount
                s.freed += amount

    def current(self, name: str) -> int:
        return self.arrays[name][0].current

    def _all_stats(self) -> list[Stat]:
        return [s for arr in self.arrays.values() for s in arr] + [self.oversize_allocations, self.oversize_segments]

    def reset_peak(self) -> None:
        for s in self._all_stats():
            s.reset_peak()

    def reset_accumulated(self) -> None:
        for s in self._all_stats():
            s.reset_accumulated()
        for name in COUNTERS:
            setattr(self, name, 0)

    def as_dict(self, max_split_size: int) -> dict[str, int]:
        """The flat, sorted dict torch.cuda.memory_stats() returns ("allocated_bytes.all.peak": ...)."""
        out: dict[str, int] = {}
        for name, arr in self.arrays.items():
            for type_name, s in zip(STAT_TYPES, arr, strict=True):
                for field in Stat.__slots__:
                    out[f"{name}.{type_name}.{field}"] = getattr(s, field)
        for name in ("oversize_allocations", "oversize_segments"):
            s = getattr(self, name)
            for field in Stat.__slots__:
                out[f"{name}.{field}"] = getattr(s, field)
        for name in COUNTERS:
            out[name] = getattr(self, name)
        out["max_split_size"] = max_split_size
        return dict(sorted(out.items()))
