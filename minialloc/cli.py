"""The `minialloc` command: demo, replay, plot, serve-sim."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .allocator import CachingAllocator
from .device import SimulatedGPU
from .oom import OutOfMemoryError
from .replay import TraceError, read_trace, replay, what_if
from .sizes import format_size, parse_size
from .workloads import CANONICAL_CAPACITY, canonical_scenario


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


def run_demo(plot_dir: str | None = None, out=None) -> int:
    """The canonical failure natively, then fixed with expandable segments, then a side-by-side table."""
    out = out or sys.stdout
    events = canonical_scenario()
    failing = len(events) - 1
    p = lambda *a: print(*a, file=out)  # noqa: E731 - a short local alias keeps the report readable
    p(f'minialloc demo: "5 GB free, can\'t allocate 2 GB" on a simulated {format_size(CANONICAL_CAPACITY)} GPU\n')
    p("The trace (minialloc.workloads.canonical_scenario): step 1 keeps eight 840 MiB activations, then frees")
    p("them; step 2 keeps eight 425 MiB activations and briefly uses ~410 MiB workspaces; backward then asks")
    p("for a 2 GiB gradient buffer.\n")

    p("1. Native allocator (PyTorch's default policy)")
    native_gpu = SimulatedGPU(CANONICAL_CAPACITY)
    native = CachingAllocator(native_gpu, "")
    replay(events[:failing], native)
    grad = events[failing]
    try:
        native.malloc(grad.size)
        p("   unexpected: the gradient buffer fit")
        return 1
    except OutOfMemoryError as e:
        report = e.report
        p(f"   malloc({format_size(grad.size)}) raised OutOfMemoryError:\n")
        p("   " + str(e).replace(". ", ".\n   "))
    pieces = [b for s in native.snapshot()["segments"] for b in s["blocks"] if b["state"] == "inactive"]
    p("\n   Free memory, added up:")
    p(f"     device free (mem_get_info)         {format_size(report.device_free):>12}")
    p(f"     reserved but unallocated (cache)   {format_size(report.reserved_unallocated):>12}"
      f"   in {len(pieces)} pieces, the largest {format_size(max(b['size'] for b in pieces))}")
    p(f"     total                              {format_size(report.total_free):>12}"
      f"   ({report.total_free / 1e9:.2f} GB)")
    freed_before = native.memory_stats()["num_device_free"]
    native.empty_cache()
    try:
        native.malloc(grad.size)
        p("   unexpected: empty_cache made room")
        return 1
    except OutOfMemoryError:
        released = native.memory_stats()["num_device_free"] - freed_before
        p(f"\n   empty_cache() and retry: still out of memory. Segments released: {released}; every segment")
        p("   holds a live 425 MiB activation, so none can go back to the device.\n")

    p("2. The same trace with expandable_segments:True")
    exp_gpu = SimulatedGPU(CANONICAL_CAPACITY)
    exp = CachingAllocator(exp_gpu, "expandable_segments:True")
    exp_result = replay(events, exp)
    trace = exp.snapshot()["device_traces"][0]
    last_unmap = max((i for i, e in enumerate(trace) if e["action"] == "segment_unmap"), default=len(trace))
    unmapped = sum(e["size"] for e in trace if e["action"] == "segment_unmap")
    remapped = sum(e["size"] for e in trace[last_unmap:] if e["action"] == "segment_map")
    page = 20 * 2**20  # the large pool's page
    if exp_result.ooms:
        p("   unexpected: expandable segments did not help")
        return 1
    p(f"   malloc({format_size(grad.size)}) succeeded. On the way the allocator unmapped {unmapped // page} wholly")
    p(f"   free 20 MiB pages from the holes ({format_size(unmapped)}) and mapped {remapped // page} pages again at")
    p("   the end of one contiguous range.\n")

    p("3. Side by side")
    native_stats, exp_stats = native.memory_stats(), exp.memory_stats()
    widths = (34, 14, 14)
    p("   " + _row(("", "native", "expandable"), widths))
    rows = [
        ("2 GiB gradient buffer", "OOM", "ok"),
        ("peak reserved", format_size(native.max_memory_reserved()), format_size(exp.max_memory_reserved())),
        ("reserved at the end", format_size(native.memory_reserved()), format_size(exp.memory_reserved())),
        ("device mallocs or page maps", str(native_stats["num_device_alloc"]), str(exp_stats["num_device_alloc"])),
        ("device frees or page unmaps", str(native_stats["num_device_free"]), str(exp_stats["num_device_free"])),
        ("OOMs / alloc retries", f"{native_stats['num_ooms']} / {native_stats['num_alloc_retries']}",
         f"{exp_stats['num_ooms']} / {exp_stats['num_alloc_retries']}"),
    ]
    for r in rows:
        p("   " + _row(r, widths))
    if plot_dir is not None:
        try:
            from .viz import save_demo_plots
        except ImportError:
            p("\n--plot: plots are not available (minialloc.viz needs matplotlib: pip install 'minialloc[course]')")
            return 0
        paths = save_demo_plots(native, exp, plot_dir)
        p(f"\nPlots written: {', '.join(str(x) for x in paths)}")
    return 0


def run_replay(args: argparse.Namespace) -> int:
    try:
        events = read_trace(args.file)
        capacity = parse_size(args.capacity)
    except (TraceError, ValueError, OSError) as e:
        print(f"minialloc replay: {e}", file=sys.stderr)
        return 2
    configs = args.conf or ["", "expandable_segments:True"]
    try:
        results = what_if(events, capacity, configs, source=args.file, progress=not args.json and len(events) > 50_000)
    except (TraceError, ValueError) as e:
        print(f"minialloc replay: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"file": args.file, "capacity": capacity, "events": len(events),
                          "results": [r.as_dict() for r in results]}, indent=2))
        return 0
    print(f"{args.file}: {len(events)} events replayed on a simulated {format_size(capacity)} GPU\n")
    widths = (44, 12, 12, 10, 6, 8, 14)
    print(_row(("config", "peak alloc", "peak reserv", "efficiency", "OOMs", "retries", "first failure"), widths))
    for r in results:
        print(_row((r.config, format_size(r.peak_allocated), format_size(r.peak_reserved), f"{r.efficiency:.3f}",
                    str(r.ooms), str(r.retries), "-" if r.first_failure is None else f"event {r.first_failure}"),
                   widths))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve-sim"]:  # its options belong to serving.main: hand them over whole
        from .serving import main as serve_main

        return serve_main(argv[1:])
    parser = argparse.ArgumentParser(prog="minialloc", description="PyTorch's caching allocator, on a simulated GPU.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help='the "5 GB free, can\'t allocate 2 GB" failure, and its fix')
    demo.add_argument("--plot", metavar="DIR", help="also write the demo's pictures to DIR")
    rep = sub.add_parser("replay", help="replay a trace under other configs: would they have saved the run?")
    rep.add_argument("file", help="a snapshot pickle (PyTorch's or minialloc's) or an RMM CSV log")
    rep.add_argument("--capacity", default="8GiB", help="simulated GPU size (default 8GiB)")
    rep.add_argument("--conf", action="append", help="a config to try, e.g. expandable_segments:True; repeat it")
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    plot = sub.add_parser("plot", help="draw a snapshot's segment map and timeline as PNG and SVG")
    plot.add_argument("file")
    plot.add_argument("-o", "--out", required=True, metavar="DIR")
    sub.add_parser("serve-sim", help="contiguous vs paged KV cache on the same serving trace (see serve-sim --help)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo(args.plot)
    if args.command == "replay":
        return run_replay(args)
    if args.command == "plot":
        from .viz import plot_main

        return plot_main([args.file, "-o", args.out])
    return 2


if __name__ == "__main__":
    sys.exit(main())
