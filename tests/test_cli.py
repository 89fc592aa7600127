"""The `minialloc` command tree: every option of every subcommand is reachable, and one exit-code rule holds.

The option list is read from the parser itself, so an option added without an example here fails
test_every_option_has_an_example, and one the parser cannot reach fails test_option_is_reachable.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from minialloc import CachingAllocator, SimulatedGPU, dump_snapshot
from minialloc.cli import build_parser, main
from minialloc.replay import replay_ops
from minialloc.workloads import canonical_scenario


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(sub: argparse.ArgumentParser) -> list[str]:
    """Each optional argument by its long name (help excluded)."""
    return [max(a.option_strings, key=len) for a in sub._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


PARSER_OPTIONS = [(cmd, opt) for cmd, sub in _subparsers(build_parser()).items() for opt in _options(sub)]

# For each (subcommand, option): the words that use it (FILE stands for the snapshot, DIR for a fresh folder), and
# the exit statuses the run may end with. Replays of the canonical scenario under native settings fail (1) unless
# a config that saves it is among those tried.
EXAMPLES: dict[tuple[str, str], tuple[list[str], set[int]]] = {
    ("demo", "--plot"): (["--plot", "DIR"], {0}),
    ("replay", "--capacity"): (["FILE", "--capacity", "16GiB", "--no-fit"], {0}),
    ("replay", "--conf"): (["FILE", "--conf", "expandable_segments:True", "--no-fit"], {0}),
    ("replay", "--device"): (["FILE", "--device", "0", "--no-fit"], {0}),
    ("replay", "--from-empty"): (["FILE", "--from-empty", "--no-fit"], {0}),
    ("replay", "--check"): (["FILE", "--check"], {0}),
    ("replay", "--no-fit"): (["FILE", "--conf", "", "--no-fit"], {1}),
    ("replay", "--json"): (["FILE", "--json", "--no-fit"], {0}),
    ("replay", "--keep-start"): (["FILE", "--keep-start", "--conf", "expandable_segments:True", "--no-fit"], {0}),
    ("diagnose", "--device"): (["FILE", "--device", "0", "--no-replay"], {0}),
    ("diagnose", "--at"): (["FILE", "--at", "3", "--no-replay"], {0}),
    ("diagnose", "--capacity"): (["FILE", "--capacity", "8GiB", "--no-replay"], {0}),
    ("diagnose", "--conf"): (["FILE", "--conf", "expandable_segments:True"], {0}),
    ("diagnose", "--no-replay"): (["FILE", "--no-replay"], {0}),
    ("diagnose", "--plot"): (["FILE", "--no-replay", "--plot", "DIR"], {0}),
    ("diagnose", "--json"): (["FILE", "--json", "--no-replay"], {0}),
    ("diagnose", "--keep-start"): (["FILE", "--keep-start", "--conf", "expandable_segments:True"], {0}),
    ("scale", "--sizes"): (["S128", "S512", "--sizes", "128,512", "--to", "1024", "--no-fit"], {0}),
    ("scale", "--to"): (["S128", "S512", "--sizes", "128,512", "--to", "2048", "--no-fit"], {0}),
    ("scale", "--capacity"): (["S128", "S512", "--sizes", "128,512", "--to", "2048", "--capacity", "16GiB",
                               "--no-fit", "--conf", "expandable_segments:True"], {1}),  # about 21 GiB are needed
    ("scale", "--conf"): (["S128", "S512", "--sizes", "128,512", "--to", "1024", "--conf", "expandable_segments:True",
                           "--no-fit"], {0}),
    ("scale", "--device"): (["S128", "S512", "--sizes", "128,512", "--to", "1024", "--device", "0", "--no-fit"], {0}),
    ("scale", "--no-fit"): (["S128", "S512", "--sizes", "128,512", "--to", "1024", "--no-fit"], {0}),
    ("scale", "--json"): (["S128", "S512", "--sizes", "128,512", "--to", "1024", "--json", "--no-fit",
                           "--conf", "expandable_segments:True"], {0}),
    ("plot", "--out-dir"): (["FILE", "--out-dir", "DIR"], {0}),
    ("plot", "--device-free"): (["FILE", "-o", "DIR", "--device-free", "1GiB"], {0}),
    ("plot", "--max-rows"): (["FILE", "-o", "DIR", "--max-rows", "3"], {0}),
    ("plot", "--html"): (["FILE", "-o", "DIR", "--html"], {0, 1}),  # 1 where torch is not installed
    ("serve-sim", "--workload"): (["--workload", "alpaca", "--requests", "8"], {0}),
    ("serve-sim", "--requests"): (["--requests", "8"], {0}),
    ("serve-sim", "--seed"): (["--seed", "3", "--requests", "8"], {0}),
    ("serve-sim", "--preemption"): (["--preemption", "swap", "--requests", "8"], {0}),
    ("serve-sim", "--sharing-requests"): (["--sharing-requests", "2", "--requests", "8"], {0}),
    ("serve-sim", "--json"): (["--json", "--requests", "8"], {0}),
}


@pytest.fixture(scope="module")
def snapshot_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The canonical failure, recorded: a trace with an oom entry on an 8 GiB simulated GPU."""
    a = CachingAllocator(SimulatedGPU("8GiB"), "")
    a.record_memory_history()
    replay_ops(canonical_scenario(), a)
    path = tmp_path_factory.mktemp("cli") / "canonical.pickle"
    dump_snapshot(a, path)
    return path


SERIES = Path(__file__).parent / "fixtures" / "series"  # one program at several context lengths (scale)


def _words(words: list[str], snapshot: Path, tmp_path: Path) -> list[str]:
    """FILE: the snapshot; DIR: a fresh folder; S128, S512: the real series' runs at those context lengths."""
    series = {f"S{n}": str(SERIES / f"linyun-xl_ctx{n}_forward_none.pickle") for n in (128, 512)}
    return [str(snapshot) if w == "FILE" else str(tmp_path / "out") if w == "DIR" else series.get(w, w)
            for w in words]


def test_every_option_has_an_example() -> None:
    assert set(PARSER_OPTIONS) == set(EXAMPLES), "an option of the parser has no example here, or one went away"


@pytest.mark.parametrize(("command", "option"), PARSER_OPTIONS)
def test_option_is_reachable(command: str, option: str, snapshot_file: Path, tmp_path: Path) -> None:
    """The parser accepts the option, sets its value away from the default, and the run ends as expected."""
    words, statuses = EXAMPLES[(command, option)]
    argv = [command, *_words(words, snapshot_file, tmp_path)]
    sub = _subparsers(build_parser())[command]
    args = build_parser().parse_args(argv)
    (action,) = (a for a in sub._actions if option in a.option_strings)
    assert getattr(args, action.dest) != action.default, f"{option} did not reach the namespace"
    assert main(argv) in statuses


def test_plot_options_reach_the_pictures(snapshot_file: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`plot FILE --max-rows --device-free` was refused by the old glued parsers; now it draws."""
    assert main(["plot", str(snapshot_file), "-o", str(tmp_path), "--max-rows", "2", "--device-free", "1GiB"]) == 0
    written = [Path(line) for line in capsys.readouterr().out.split()]
    assert written and all(p.exists() for p in written)


@pytest.mark.parametrize("argv", [
    [],                                      # no subcommand
    ["frobnicate"],                          # unknown subcommand
    ["replay"],                              # missing FILE
    ["demo", "--no-such-option"],
    ["plot", "FILE", "--max-rows", "0"],
    ["plot", "FILE", "--device-free", "lots"],
    ["serve-sim", "--requests", "0"],
    ["serve-sim", "--workload", "nope"],
    ["diagnose", "FILE", "--at", "many"],
])
def test_bad_usage_exits_2(argv: list[str], snapshot_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(snapshot_file) if w == "FILE" else w for w in argv]) == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["replay", "diagnose", "plot"])
def test_bad_input_exits_2_with_one_line(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in (tmp_path / "missing.pickle", tmp_path / "corrupt.pickle"):
        if path.name == "corrupt.pickle":
            path.write_bytes(b"\x80\x04not a pickle at all")
        assert main([command, str(path), "-o", str(tmp_path)] if command == "plot" else [command, str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"minialloc {command}: ") and err.count("\n") == 1


def test_a_failed_run_exits_1(snapshot_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Native settings alone cannot save the canonical run: the answer is printed, and the status says so."""
    assert main(["replay", str(snapshot_file), "--conf", "", "--no-fit"]) == 1
    assert "verdict" in capsys.readouterr().out


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("demo", "replay", "diagnose", "plot", "serve-sim"))


def test_serve_sim_prints_figures_not_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve-sim", "--requests", "12", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "requirements" not in result and result["concurrency_gain"] > 0
