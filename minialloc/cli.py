"""The `minialloc` command: one parser, six subcommands (demo, replay, diagnose, scale, plot, serve-sim).

Exit codes, the same for every subcommand: 0 the answer was printed; 1 the run failed (`replay` found an OOM
under every config tried, `replay --check` found an allocation away from its recorded address, a demo did not
show what it shows, or an optional dependency the options need is missing); 2 bad usage or input (argparse's
own errors, and an unreadable or corrupt file, which gets one line naming what is wrong).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from .allocator import CachingAllocator
from .device import SimulatedGPU
from .lang import messages, say
from .oom import OutOfMemoryError
from .replay import (
    DEFAULT_WHAT_IF,
    ReplayResult,
    StartStateDoesNotFit,
    check_capacity,
    check_trace,
    check_trace_file,
    load_trace_file,
    open_device_traces,
    read_trace,
    replay,
    shown_label,
    verdict,
    what_if,
    what_if_trace,
)
from .sizes import decimal_size_hint, format_size, parse_size, readable_size
from .trace import DeviceTrace, TraceError, devices, read_device_trace, recorded_config, why_not_replayable
from .workloads import CANONICAL_CAPACITY, canonical_scenario

# What replay and diagnose print for a person follows minialloc.lang (MINIALLOC_LANG on the command line, which a
# translated chapter exports for the commands it starts); --json keeps its English keys and values.
TEXT = messages("minialloc.cli.TEXT", {
    "check_header": "{file}: replayed under the recorded settings ({config}) from the state at the first trace entry",
    "source_oom": "the oom at trace entry {entry}: reserved + device_free",
    "start_empty": "an empty GPU (--from-empty)",
    "start_state": "the state at the first trace entry ({reserved} reserved, {live} live blocks)",
    "capacity": "capacity {capacity}{hint} (from {source})",
    "no_limit": "no capacity limit",
    "header": "{file}, device {device}: {entries} trace entries",
    "replayed_from": "replayed from {start}",
    "budget": "{budget}; recorded peak reserved {peak}",
    "relaid_note": "rows marked re-laid start from the {live} live blocks and the cached free memory at the first "
                   "entry, each allocated again under the row's setting (the cache then freed), so they compare with "
                   "each other (--keep-start keeps the run's segments instead)",
    "col_config": "config",
    "col_peak_alloc": "peak alloc",
    "col_peak_reserved": "peak reserv",
    "col_ooms": "OOMs",
    "col_first_fails": "first fails",
    "col_fits_on": "fits on",
    "relaid_heading": "re-laid from the live and cached blocks at the first entry:",
    "entry": "entry {entry}",
    "from_frames": " from {frames}",
    "failure": "{label}: trace entry {entry} asked for {size}{where} with {live} live and {reserved} reserved",
    "skipped_frees": "{n} frees of blocks allocated before the trace began were skipped: these figures leave out "
                     "what the run held then (drop --from-empty)",
    "verdict": "verdict: {line}",
    "recorded_settings": "{file}: recorded settings {config}",
    "capacity_hint": "--capacity {arg} is {size} {hint}",
    "plots_written": "plots written to {folder}: {names}",
    "ranks_header": "{files} snapshots, {ranks} ranks (each file's own state, no replay)",
    "no_rank_on_device": "no file holds segments on device {device}",
})


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
    native.record_memory_history()  # off until asked, as in PyTorch: the plots and the trace below read it
    replay(events[:failing], native)
    grad = events[failing]
    try:
        native.malloc(grad.size)
        p("   unexpected: the gradient buffer fit")
        return 1
    except OutOfMemoryError as e:
        report = e.report
        p(f"   malloc({format_size(grad.size)}) raised OutOfMemoryError:\n")
        p("\n".join("   " + line.strip() for line in str(e).replace(". ", ".\n").split("\n") if line.strip()))
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
    exp.record_memory_history()
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
            return 1
        paths = save_demo_plots(native, exp, plot_dir)
        p(f"\nPlots written: {', '.join(str(x) for x in paths)}")
    return 0


def run_replay(args: argparse.Namespace) -> int:
    """minialloc replay FILE: exit 0 with an answer, 1 when no setting avoids an OOM (or --check finds an
    allocation away from its recorded address), 2 for bad usage or an unreadable file."""
    try:
        capacity = parse_size(args.capacity) if args.capacity else None
        check_capacity(capacity)
        check_trace_file(args.file)  # a directory, an empty or JSON file: named for what it is
        if _is_rmm_or_events(args.file):
            return _replay_events(args, capacity)
        snap, traces = open_device_traces(args.file, args.device, args.from_empty)
    except (TraceError, ValueError, OSError) as e:
        print(f"minialloc replay: {_one_line(e)}", file=sys.stderr)
        return 2
    recorded = recorded_config(snap)
    progress = not args.json
    try:
        if args.check:
            if args.from_empty:
                print("minialloc replay: --check compares addresses from the rebuilt state; drop --from-empty",
                      file=sys.stderr)
                return 2
            checks = [check_trace(t, recorded, progress=progress) for t in traces]
            if args.json:
                print(json.dumps({"file": args.file, "config": recorded, "devices": [asdict(c) | {"ok": c.ok}
                                                                                    for c in checks]}, indent=2))
            else:
                print(say(TEXT, "check_header", file=args.file, config=recorded or "native"))
                for c in checks:
                    print(c.summary())
            return 0 if all(c.ok for c in checks) else 1
        reports = []
        for t in traces:
            cap, source = capacity, "--capacity"
            if cap is None and t.capacity_at_oom() is not None:
                cap, source = t.capacity_at_oom(), f"the oom at trace entry {t.oom_entries[0]}: reserved + device_free"
            rows = what_if_trace(t, recorded, args.conf or DEFAULT_WHAT_IF, cap, fit=not args.no_fit,
                                 progress=progress, relaid=False if args.keep_start else None)
            reports.append((t, cap, source, rows, verdict(rows, cap, t.reserved_at_start)))
    except StartStateDoesNotFit as e:  # an answer about the run (it needs more), not bad input
        print(f"minialloc replay: {_one_line(e)}", file=sys.stderr)
        return 1
    except (TraceError, ValueError) as e:
        print(f"minialloc replay: {_one_line(e)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"file": args.file, "recorded_config": recorded or "native", "from_empty": args.from_empty,
                          "devices": [
            {"device": t.device, "capacity": cap, "capacity_source": source if cap else None,
             "trace_entries": len(t.entries), "reserved_at_first_entry": t.reserved_at_start,
             "recorded_peak_reserved": t.recorded_peak_reserved, "verdict": v,
             "results": [r.as_dict() for r in rows]} for t, cap, source, rows, v in reports]}, indent=2))
    else:
        hint = decimal_size_hint(args.capacity) if args.capacity else ""
        for t, cap, source, rows, v in reports:
            _print_device_table(args.file, t, cap, source, rows, v, args.from_empty,
                                hint if source == "--capacity" else "")
    return 1 if any(all(r.failed for r in rows) for _, _, _, rows, _ in reports) else 0


def _print_device_table(path: str, t: DeviceTrace, cap: int | None, source: str, rows: list[ReplayResult],
                        v: str, from_empty: bool, hint: str = "") -> None:
    format_size = readable_size  # minialloc's own figures (PyTorch's format stays in PyTorch's message)
    start = say(TEXT, "start_empty") if from_empty else say(
        TEXT, "start_state", reserved=format_size(t.reserved_at_start), live=len(t.live_at_start))
    if source != "--capacity" and t.oom_entries:  # the JSON keeps the English; a person reads it translated
        source = say(TEXT, "source_oom", entry=t.oom_entries[0])
    budget = (say(TEXT, "capacity", capacity=format_size(cap), hint=" " + hint if hint else "", source=source) if cap
              else say(TEXT, "no_limit"))
    print(say(TEXT, "header", file=path, device=t.device, entries=len(t.entries)))
    print(say(TEXT, "replayed_from", start=start))
    print(say(TEXT, "budget", budget=budget, peak=format_size(t.recorded_peak_reserved)))
    if any(r.relaid for r in rows):
        print("\n".join(textwrap.wrap(say(TEXT, "relaid_note", live=len(t.live_at_start)), 110,
                                      break_on_hyphens=False)))
    print()
    # re-laid rows sit under their own heading, named by their config alone (the label says it in JSON and text)
    names = [r.config if r.relaid else shown_label(r) for r in rows]
    head = tuple(say(TEXT, f"col_{c}") for c in ("config", "peak_alloc", "peak_reserved", "ooms", "first_fails",
                                                  "fits_on"))
    # a long label, or a heading longer in the notebook's language, widens its column
    widths = tuple(max(w, len(h)) for w, h in zip((max(36, *(len(n) for n in names)), 12, 12, 6, 12, 12), head,
                                                  strict=True))
    print(_row(head, widths))
    for k, (r, name) in enumerate(zip(rows, names, strict=True)):
        if r.relaid and not rows[k - 1].relaid:
            print(say(TEXT, "relaid_heading"))
        fail = "-" if r.first_failure_entry is None else say(TEXT, "entry", entry=r.first_failure_entry)
        print(_row((name, format_size(r.peak_allocated), format_size(r.peak_reserved), str(r.ooms), fail,
                    "-" if r.fits_on is None else format_size(r.fits_on)), widths))
    for r in rows:
        if r.first_failure_entry is not None:
            where = say(TEXT, "from_frames", frames="; ".join(r.first_failure_frames)) if r.first_failure_frames else ""
            print("\n" + "\n  ".join(textwrap.wrap(say(
                TEXT, "failure", label=shown_label(r), entry=r.first_failure_entry,
                size=format_size(r.first_failure_size), where=where, live=format_size(r.live_at_failure),
                reserved=format_size(r.reserved_at_failure)), 110, break_on_hyphens=False)))
    if from_empty and rows and rows[0].skipped_frees:
        print("\n" + say(TEXT, "skipped_frees", n=rows[0].skipped_frees))
    print()
    for k, line in enumerate(v.splitlines()):  # one short line each, for a terminal
        print("\n  ".join(textwrap.wrap(say(TEXT, "verdict", line=line) if k == 0 else line, 110,
                                        break_on_hyphens=False)))
    print()


def _is_rmm_or_events(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(1) != b"\x80"  # not a pickle: an RMM CSV log (read_trace says if it is neither)


def _replay_events(args: argparse.Namespace, capacity: int | None) -> int:
    """An RMM log: no state to rebuild, no recorded settings, one device."""
    events = read_trace(args.file)
    cap = capacity or parse_size("8GiB")
    results = what_if(events, cap, args.conf or ["", "expandable_segments:True"], source=args.file,
                      progress=not args.json and len(events) > 50_000)
    if args.json:
        print(json.dumps({"file": args.file, "capacity": cap, "events": len(events),
                          "results": [r.as_dict() for r in results]}, indent=2))
        return 0
    print(f"{args.file}: {len(events)} events replayed on a simulated {format_size(cap)} GPU\n")
    widths = (44, 12, 12, 10, 6, 8, 14)
    print(_row(("config", "peak alloc", "peak reserv", "efficiency", "OOMs", "retries", "first failure"), widths))
    for r in results:
        print(_row((r.config, format_size(r.peak_allocated), format_size(r.peak_reserved), f"{r.efficiency:.3f}",
                    str(r.ooms), str(r.retries), "-" if r.first_failure is None else r.first_failure_label),
                   widths))
    return 1 if results and all(r.ooms for r in results) else 0


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def run_diagnose(args: argparse.Namespace) -> int:
    """minialloc diagnose FILE: exit 0 with a report, 2 for bad usage or an unreadable file."""
    from .diagnose import diagnose, diagnose_state, save_diagnosis_plots

    if len(args.files) > 1 or Path(args.files[0]).is_dir():
        return _diagnose_ranks(args)
    args.file = args.files[0]
    try:
        capacity = parse_size(args.capacity) if args.capacity else None
        check_capacity(capacity)
        snap = load_trace_file(args.file)
        found = devices(snap)
        if args.device is not None and args.device not in found:
            raise TraceError(f"{args.file}: nothing recorded for device {args.device}; the file has devices "
                             f"{', '.join(map(str, found)) or 'none'}")
        if not found:
            raise TraceError(f"{args.file}: the snapshot holds no segment and no trace: nothing to diagnose")
        reports, traces = [], []
        for device in found if args.device is None else [args.device]:
            why = why_not_replayable(snap, device)
            if why is not None:  # the state the file holds is still worth reading
                reports.append(diagnose_state(snap, device, why))
                continue
            t = read_device_trace(snap, device, args.file)
            traces.append(t)
            reports.append(diagnose(t, snap, capacity=capacity, at=args.at, configs=tuple(args.conf or DEFAULT_WHAT_IF),
                                    replay_rows=not args.no_replay, relaid=False if args.keep_start else None))
        paths = []
        if args.plot:
            for t in traces:
                d = next(r for r in reports if r.device == t.device)
                paths += save_diagnosis_plots(d, t, args.plot, recorded_config(snap))
    except StartStateDoesNotFit as e:  # an answer about the run, as replay gives it
        print(f"minialloc diagnose: {_one_line(e)}", file=sys.stderr)
        return 1
    except (TraceError, ValueError, OSError) as e:
        print(f"minialloc diagnose: {_one_line(e)}", file=sys.stderr)
        return 2
    except ImportError:
        print("minialloc diagnose: --plot needs matplotlib: pip install 'minialloc[course]'", file=sys.stderr)
        return 1
    # the same rule as replay's: 1 when no setting tried avoids the OOM
    status = 1 if any(d.rows and all(r.failed for r in d.rows) for d in reports) else 0
    if args.json:
        print(json.dumps({"file": args.file, "devices": [d.as_dict() for d in reports],
                          "plots": [str(p) for p in paths]}, indent=2))
        return status
    print(say(TEXT, "recorded_settings", file=args.file, config=recorded_config(snap) or "native") + "\n")
    hint = decimal_size_hint(args.capacity) if args.capacity else ""
    if hint:
        print(say(TEXT, "capacity_hint", arg=args.capacity, size=format_size(capacity or 0), hint=hint) + "\n")
    for d in reports:
        print(d.text() + "\n")
    if paths:
        print(say(TEXT, "plots_written", folder=args.plot, names=", ".join(p.name for p in paths)))
    return status


def _diagnose_ranks(args: argparse.Namespace) -> int:
    """minialloc diagnose a.pickle b.pickle ... (or a folder): one table across ranks, from each file's state."""
    from .ranks import rank_files, rank_states, rank_table, rank_verdict

    try:
        files = rank_files(args.files)
        rows = rank_states(files)
    except (TraceError, ValueError, OSError) as e:
        print(f"minialloc diagnose: {_one_line(e)}", file=sys.stderr)
        return 2
    if args.device is not None:
        rows = [r for r in rows if r.device == args.device]
    verdict_text = rank_verdict(rows) if rows else say(TEXT, "no_rank_on_device", device=args.device)
    if args.json:
        print(json.dumps({"files": [str(f) for f in files], "ranks": [r.as_dict() for r in rows],
                          "verdict": verdict_text}, indent=2))
        return 0
    print(say(TEXT, "ranks_header", files=len(files), ranks=len(rows)) + "\n")
    print(rank_table(rows) + "\n")
    for line in verdict_text.splitlines():
        print("\n  ".join(textwrap.wrap(line, 110, break_on_hyphens=False)))
    return 0


def run_plot(args: argparse.Namespace) -> int:
    """minialloc plot FILE: the segment map and timeline as PNG and SVG (and PyTorch's viewer with --html)."""
    try:
        from .viz import save_plots, write_trace_plot_html
    except ImportError:
        print("minialloc plot: needs matplotlib: pip install 'minialloc[course]'", file=sys.stderr)
        return 1
    try:
        paths = save_plots(args.file, args.out_dir, device_free=args.device_free, max_rows=args.max_rows)
        if args.html:
            paths.append(write_trace_plot_html(args.file, Path(args.out_dir) / "trace.html"))
    except (OSError, ValueError) as e:  # SnapshotError and VizInputError are ValueErrors: the file is at fault
        print(f"minialloc plot: {_one_line(e)}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # --html without torch: the run could not be done here
        print(f"minialloc plot: {_one_line(e)}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


def run_serve_sim(args: argparse.Namespace) -> int:
    """minialloc serve-sim: contiguous vs paged KV cache on one seeded serving trace."""
    from .serving import format_table, serve_sim

    result = serve_sim(args.workload, args.requests, args.seed, preemption=args.preemption,
                       sharing_requests=args.sharing_requests)
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


def run_scale(args: argparse.Namespace) -> int:
    """minialloc scale A B [C] --sizes ... --to N: exit 0 with a prediction (1 when it does not fit in
    --capacity), 2 for bad usage, unreadable files or runs that cannot be matched."""
    from .scale import ScaleError, parse_sizes, report, scale

    try:
        capacity = parse_size(args.capacity) if args.capacity else None
        check_capacity(capacity)
        sizes = parse_sizes(args.sizes)
        try:
            target = float(args.to)
        except ValueError:
            raise ScaleError(f"--to {args.to!r}: give the size to predict, a number like 512") from None
        for f in args.files:
            check_trace_file(f)
        prediction = scale(args.files, sizes, target, configs=args.conf if args.conf is not None
                           else DEFAULT_WHAT_IF[1:], capacity=capacity, device=args.device, fit=not args.no_fit)
    except (TraceError, ScaleError, ValueError, OSError) as e:
        print(f"minialloc scale: {_one_line(e)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(prediction.as_dict(), indent=2))
    else:
        print(report(prediction))
    return 1 if capacity is not None and prediction.recorded.failed else 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree; each subcommand's parser carries its handler as the `run` default."""
    from .serving import REQUEST_WORKLOADS  # numpy only: cheap, and it keeps the choices in one place

    parser = argparse.ArgumentParser(prog="minialloc", description="PyTorch's caching allocator, on a simulated GPU.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(run=run)
        return p

    demo = command("demo", lambda a: run_demo(a.plot), 'the "5 GB free, can\'t allocate 2 GB" failure, and its fix')
    demo.add_argument("--plot", metavar="DIR", help="also write the demo's pictures to DIR")

    rep = command("replay", run_replay, "replay a trace under other configs: would they have saved the run?")
    rep.add_argument("file", help="a snapshot pickle (PyTorch's or minialloc's) or an RMM CSV log")
    rep.add_argument("--capacity", help="simulated GPU size, e.g. 80GiB (default: from the trace's oom entry, "
                     "else no limit; 8GiB for an RMM log)")
    rep.add_argument("--conf", action="append", help="a config to try, e.g. expandable_segments:True; repeat it "
                     "(default: native, expandable_segments:True, max_split_size_mb:256)")
    rep.add_argument("--device", type=int, help="only this device (default: every device in the file)")
    rep.add_argument("--from-empty", action="store_true", help="replay from an empty GPU, not from the state at "
                     "the first trace entry")
    rep.add_argument("--check", action="store_true", help="replay under the recorded settings and compare every "
                     "allocation's address with the recorded one")
    rep.add_argument("--no-fit", action="store_true", help="skip the search for the smallest device each fits on")
    rep.add_argument("--keep-start", action="store_true", help="what-if rows keep the run's segments at the first "
                     "trace entry, as if the setting were switched on there (default for a trace that starts "
                     "mid-run: re-lay its live blocks under each setting)")
    rep.add_argument("--json", action="store_true", help="machine-readable output")

    dia = command("diagnose", run_diagnose, "after an OOM: who holds the memory, what is pinned, what would help")
    dia.add_argument("files", nargs="+", metavar="FILE", help="a snapshot pickle (torch.cuda.memory._dump_snapshot); "
                     "several, or a folder of them (one per rank), give one table across ranks")
    dia.add_argument("--device", type=int, help="only this device (default: every device in the file)")
    dia.add_argument("--at", type=int, metavar="ENTRY", help="the state before this trace entry (default: the "
                     "first failure, else the peak of reserved memory)")
    dia.add_argument("--capacity", help="simulated GPU size (default: from the trace's oom entry, else no limit)")
    dia.add_argument("--conf", action="append", help="configs for the verdict's replay; repeat it")
    dia.add_argument("--no-replay", action="store_true", help="skip the what-if replay and its verdict")
    dia.add_argument("--keep-start", action="store_true", help="what-if rows keep the run's segments at the first "
                     "trace entry instead of re-laying its live blocks")
    dia.add_argument("--plot", metavar="DIR", help="also write the segment map and timeline at that moment")
    dia.add_argument("--json", action="store_true", help="machine-readable output")

    sc = command("scale", run_scale, "from runs of one program at several sizes (context length, batch), its "
                 "memory at another size: will it fit?")
    sc.add_argument("files", nargs="+", metavar="FILE", help="two or more snapshot pickles of the same program, "
                    "one per size")
    sc.add_argument("--sizes", required=True, help="the size parameter of each file, in order, e.g. 128,256")
    sc.add_argument("--to", required=True, metavar="SIZE", help="the size to predict, e.g. 512")
    sc.add_argument("--capacity", help="a device size for the verdict, e.g. 40GiB (default: the smallest it fits on)")
    sc.add_argument("--conf", action="append", help="a what-if config beside the recorded settings; repeat it "
                    "(default: expandable_segments:True, max_split_size_mb:256)")
    sc.add_argument("--device", type=int, help="the device whose trace to scale (default: the file's only one)")
    sc.add_argument("--no-fit", action="store_true", help="skip the search for the smallest device each fits on")
    sc.add_argument("--json", action="store_true", help="machine-readable output (sizes in bytes)")

    plot = command("plot", run_plot, "draw a snapshot's segment map and timeline as PNG and SVG")
    plot.add_argument("file", help="a snapshot pickle (torch.cuda.memory._dump_snapshot or minialloc's)")
    plot.add_argument("-o", "--out-dir", default=".", metavar="DIR", help="where to write the pictures "
                      "(default: here)")
    plot.add_argument("--device-free", type=parse_size, metavar="SIZE",
                      help="device free memory for the title, e.g. 3GiB (a snapshot does not record it)")
    plot.add_argument("--max-rows", type=_positive_int, default=40, help="segment rows before the rest are summed")
    plot.add_argument("--html", action="store_true",
                      help="also write trace.html, PyTorch's interactive viewer (needs torch)")

    sim = command("serve-sim", run_serve_sim, "contiguous vs paged KV cache on one serving trace (PagedAttention, "
                  "Kwon et al. SOSP 2023): OPT-13B on a simulated A100-40GB")
    sim.add_argument("--workload", choices=sorted(REQUEST_WORKLOADS), default="sharegpt")
    sim.add_argument("--requests", type=_positive_int, default=1000, help="number of requests in the trace")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--preemption", choices=("recompute", "swap"), default="recompute")
    sim.add_argument("--sharing-requests", type=_positive_int, default=None,
                     help="requests for the sharing runs (default: a quarter of --requests)")
    sim.add_argument("--json", action="store_true",
                     help='print JSON instead of the table: {"paged": {...}, "contiguous": {...}, ...}, each with '
                          "token_share and max_concurrent")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (argparse's usage errors and --help included, not raised)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2): a status like any other
        return e.code if isinstance(e.code, int) else 2
    try:
        status = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        # the reader stopped reading (`| head`): no traceback; stdout goes nowhere so the exit flush is quiet
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a command killed by the closed pipe ends


if __name__ == "__main__":
    sys.exit(main())
