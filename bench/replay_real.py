"""How long `minialloc replay` takes on a long real-format trace (a figure, not a test).

A training-like minialloc run records into a 100,000-entry ring buffer (so the trace starts mid-run, as real ones
do) and is written in PyTorch's snapshot schema. Then, timed separately: reading it and rebuilding the state at
its first entry; the --check replay; the replay under four configs (the recorded one and three what-ifs), as
`minialloc replay FILE --no-fit` does; and the search for the smallest device for one config. The five real
snapshots in tests/fixtures/real_snapshots follow, each checked and replayed under four configs.

    python bench/replay_real.py [--quick] [--entries 100000]
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from minialloc import CachingAllocator, MiB, SimulatedGPU
from minialloc.oom import OutOfMemoryError
from minialloc.replay import check_trace, replay_trace, smallest_capacity, what_if_trace
from minialloc.timing import bench_parser
from minialloc.trace import devices, read_device_trace, read_snapshot, recorded_config, why_not_replayable

CONFIGS = ["expandable_segments:True", "max_split_size_mb:256", "max_split_size_mb:64"]
REAL = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "real_snapshots"


def recorded_run(entries: int, seed: int = 0) -> dict:
    """A run long enough to fill the ring buffer, as a snapshot whose trace entries keep PyTorch's keys only."""
    rng = random.Random(seed)
    a = CachingAllocator(SimulatedGPU("40GiB"), "")
    a.record_memory_history(max_entries=entries)
    weights = [a.malloc(rng.choice([1, 4, 24, 96]) * MiB) for _ in range(200)]
    live: list[int] = []
    step = 0
    while step < 3 or len(a.snapshot()["device_traces"][0]) < entries:
        for _ in range(400):  # forward: activations kept
            live.append(a.malloc(rng.choice([2048, 70_000, 3 * MiB, 12 * MiB, 48 * MiB])))
            if rng.random() < 0.3:  # a workspace, freed at once
                try:
                    a.free(a.malloc(rng.choice([8 * MiB, 30 * MiB])))
                except OutOfMemoryError:
                    pass
        while live:  # backward: freed in reverse
            a.free(live.pop())
        step += 1
    snap = a.snapshot()
    del weights
    keep = ("action", "addr", "device_free", "size", "stream", "time_us", "compile_context", "user_metadata")
    snap["device_traces"] = [[{k: e[k] for k in keep if k in e} for e in t if e["action"] != "snapshot"]
                             for t in snap["device_traces"]]
    return snap


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--entries", type=int, default=None, help="trace entries recorded (default 100,000; "
                        "--quick: 10,000)")
    args = parser.parse_args(argv)
    entries = args.entries or (10_000 if args.quick else 100_000)

    t = time.perf_counter()
    snap = recorded_run(entries)
    print(f"recorded a run: {len(snap['device_traces'][0])} trace entries ({time.perf_counter() - t:.1f} s)")
    t = time.perf_counter()
    trace = read_device_trace(snap, 0, "bench")
    print(f"read it, rebuilt the state at its first entry ({len(trace.start_segments)} segments, "
          f"{len(trace.live_at_start)} live blocks): {time.perf_counter() - t:.2f} s")
    conf = recorded_config(snap)
    t = time.perf_counter()
    check = check_trace(trace, conf, progress=True)
    print(f"--check: {check.summary()}: {time.perf_counter() - t:.2f} s")
    t = time.perf_counter()
    rows = what_if_trace(trace, conf, CONFIGS, None, fit=False, progress=True)
    took = time.perf_counter() - t
    print(f"replay under {len(rows)} configs ({len(trace.ops)} operations each): {took:.2f} s")
    for r in rows:
        print(f"   {r.label:<36} peak reserved {r.peak_reserved / 2**30:7.2f} GiB")
    t = time.perf_counter()
    unlimited, _ = replay_trace(trace, conf)
    fits = smallest_capacity(trace, conf, unlimited)
    print(f"smallest device for the recorded config: {fits / 2**30:.2f} GiB, found in {time.perf_counter() - t:.2f} s")

    print("\nthe real snapshots (check, then four configs without the fit search):")
    for path in sorted(REAL.glob("*.pickle")):
        t = time.perf_counter()
        real = read_snapshot(path)
        for device in devices(real):
            why = why_not_replayable(real, device)
            if why is not None:  # no trace, one too short, or another allocator: nothing to time
                print(f"   {path.name:<52} device {device}: not replayed ({why.split(',')[0]})")
                continue
            tr = read_device_trace(real, device, str(path))
            c = check_trace(tr, recorded_config(real))
            what_if_trace(tr, recorded_config(real), CONFIGS, None, fit=False)
            print(f"   {path.name:<52} {len(tr.entries):>6} entries  {c.at_recorded_address}/{c.allocations} at "
                  f"the recorded address  {time.perf_counter() - t:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
