"""Run a lab's answers in a fresh sandboxed process and read back what its probes return, as data.

`run_steps` is the one side of the grader that runs student code, and its interface is narrow: steps and a
probe file go in, and what comes back is, for each step, whether it ended in the grader's time, the probe's data
(to be checked by the caller, in the grader's process, against references the sandbox never sees) or the
grader's own words for how it failed. It starts grading/labdriver.py under the bubblewrap policy of
grading.sandbox (no network, its own pid namespace, the memory and process limits, nothing of the grader's files;
the policy passed in a memfd, `bwrap --args FD`, as for the kernels), with:
- a grading copy of minialloc (`grading_package`): the simulated device, sizes and workloads, which the labs'
  answers legitimately use; every other public name (CachingAllocator, ExpandableSegment, BlockManager, the OOM
  report...) is a placeholder that raises `Withheld` when used, and their modules are not there to read or exec;
- the driver and its input (the steps and the probes: inputs only, no expected value) as the script on its
  standard input, and its standard output a pipe on which it reports one JSON object a line; its arguments are
  `python -I -`, its environment the kernel's (probe_env).

The grader enforces the limits from outside: a step that has not ended `cell_timeout + grace` (+2) seconds after
the step before it is killed with the whole sandbox, and so is a program past `total_timeout` or one that sends
more than `max_bytes`. Reports are parsed strictly (labrun._follow) and never shown: see FAILURES.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic

from .labspecs.probe_common import known_name
from .privacy import scratch_root
from .sandbox import PASS_ENV, Policy, with_args_fd

DRIVER = Path(__file__).with_name("labdriver.py")
MINIALLOC = Path(importlib.util.find_spec("minialloc").submodule_search_locations[0])  # the grader's own copy
# The files of minialloc an answer may use at grading: the simulated GPU and what it imports, sizes, workloads,
# and the language setting (a translated lab's setup cell calls minialloc.lang.set_lang).
GRADING_FILES = ("sizes.py", "device.py", "workloads.py", "lang.py", "devices/__init__.py", "devices/base.py",
                 "devices/simulated.py", "devices/data.py", "devices/cuda.py", "kernels/__init__.py",
                 "kernels/reference.py")
GRADING_INIT = '''\
"""minialloc as lab answers see it at grading: the simulated device, sizes and workloads; the rest withheld."""

from ._withheld import withheld
from .device import DataGPU, DeviceError, DeviceOutOfMemory, SimulatedGPU
from .sizes import GiB, KiB, MiB, format_size, parse_size


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return withheld("minialloc", name)
'''
WITHHELD = '''\
"""Placeholders for what minialloc withholds from lab answers at grading."""


class Withheld(RuntimeError):
    """Raised by every use of a withheld name."""


def withheld(module, name):
    def refuse(*args, **kwargs):
        raise Withheld(f"{module}.{name} is withheld when labs are graded: the answer must not use minialloc's "
                       "implementation")

    # a class, so that the lab's locked cells can still import it, catch it or derive from it; using it raises
    return type(name, (Exception,), {"__new__": refuse, "__init__": refuse, "__module__": module})
'''
STUB_MODULE = '''\
"""Withheld when labs are graded: every name of this module is a placeholder."""

from {dots}_withheld import withheld


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return withheld(__name__, name)
'''


def grading_package(folder: Path) -> Path:
    """Write the grading copy of minialloc into `folder`; return the folder to put on sys.path."""
    root = folder / "minialloc"
    for name in GRADING_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(MINIALLOC / name, root / name)
    (root / "__init__.py").write_text(GRADING_INIT, encoding="utf-8")
    (root / "_withheld.py").write_text(WITHHELD, encoding="utf-8")
    kept = {Path(n).parts[0].removesuffix(".py") for n in GRADING_FILES}
    for entry in MINIALLOC.iterdir():  # every other module a lab imports from (allocator, expandable, paging...)
        module = entry.name.removesuffix(".py")
        if module in kept or module.startswith("_") or not (entry.suffix == ".py" or (entry / "__init__.py").exists()):
            continue
        if entry.is_dir():
            (root / module).mkdir()
            (root / module / "__init__.py").write_text(STUB_MODULE.format(dots=".."), encoding="utf-8")
        else:
            (root / f"{module}.py").write_text(STUB_MODULE.format(dots="."), encoding="utf-8")
    return folder


@dataclass
class Step:
    """A cell to run (`source`), or a probe to call (`probe`, the function's name in the probe file, and `args`)."""

    name: str
    source: str | None = None
    probe: str | None = None
    args: object = None

    def as_json(self) -> dict:
        if self.probe is None:
            return {"kind": "cell", "name": self.name, "source": self.source}
        return {"kind": "probe", "name": self.name, "probe": self.probe, "args": self.args}


# What a step's failure is called in a verdict: the grader's words, chosen by a kind the driver names. A report is
# untrusted data (the student's code can write on the channel): nothing of its text but a known name is used.
FAILURES = {
    "raised": "the answer raised {name}",
    "interrupted": "CellTimeoutError: interrupted after the cell's time limit",
    "missing": "{name} is not defined",
    "unplain": "the probe's result is not plain data",
}
TIMED_OUT = "CellTimeoutError: the step ran past the grader's time limit; the grader ended the program"
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,59}")


@dataclass
class Outcome:
    """What happened to one step: `ran` (its end was reported), `result` (a probe's data) or `error` (the
    grader's words for how it failed)."""

    ran: bool = False
    result: object = None
    error: str | None = None


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    stopped: str | None = None  # why the program ended early (killed, timed out, too much output), if it did
    log: str = ""  # the end of the driver's own error stream, for the grader's log
    done: bool = False  # the driver reported that every step ran


def probe_env() -> dict[str, str]:
    """The environment of the grading program: the same variables a sandboxed kernel gets from the grader
    (grading.sandbox.PASS_ENV), so that nothing in it tells a probe run from a kernel run."""
    passed = {name: os.environ[name] for name in PASS_ENV if name in os.environ}
    return {"MINIALLOC_DEVICE": "sim", "MPLBACKEND": "Agg", **passed}


def kernel_argv() -> tuple[list[str], list[str]]:
    """(sys.argv, sys.orig_argv) as a sandboxed kernel that autograde starts has them (nbclient's
    `python -m ipykernel_launcher -f <connection file> --HistoryManager.hist_file=:memory:`, the file in a fresh
    folder of grading.sandbox's), for the grading program: an answer that reads them sees a kernel's."""
    spec = importlib.util.find_spec("ipykernel_launcher")
    launcher = spec.origin if spec is not None and spec.origin else "ipykernel_launcher.py"
    connection = os.path.join(tempfile.gettempdir(), f"minialloc-sandbox-{secrets.token_hex(4)}", "conn",
                              "kernel.json")
    rest = ["-f", connection, "--HistoryManager.hist_file=:memory:"]
    return [launcher, *rest], [sys.executable, "-m", "ipykernel_launcher", *rest]


def run_steps(steps: Sequence[Step], probes_source: str, *, cell_timeout: float, grace: float,
              total_timeout: float, max_bytes: int = 8 * 1024**2, memory_bytes: int = 3 * 1024**3,
              uid_base: int = 300_000, sandbox: bool = True) -> Run:
    """Run the steps in one fresh sandboxed process; the outcome of each, in order.

    Each step has `cell_timeout + grace` seconds of the grader's clock from the moment the step before it ended
    (the first from the start); the whole program `total_timeout`. No report extends either: a step that has not
    ended in time is the step that timed out, the program is killed, and every step after it did not run.
    `sandbox=False` (autograde already confined, GuardedExecute.sandbox off) runs the process unconfined: the
    grading copy of minialloc still comes first on its path, but the rest of the machine is readable to it.
    """
    scratch = Path(tempfile.mkdtemp(prefix="minialloc-labgrade-", dir=scratch_root()))  # private: grading/privacy.py
    run = Run([Outcome() for _ in steps])
    try:
        os.chmod(scratch, 0o755)
        packages = grading_package(scratch / "packages")
        for folder, dirs, files in os.walk(scratch):  # readable by the sandbox's own user id, writable by none
            for name in dirs:
                os.chmod(os.path.join(folder, name), 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        spec = {"packages": str(packages), "probes": probes_source, "cell_timeout": cell_timeout,
                "steps": [s.as_json() for s in steps]}
        spec["argv"], spec["orig_argv"] = kernel_argv()
        script = DRIVER.read_text(encoding="utf-8") + f"\n\nmain({json.dumps(spec)!r})\n"
        uid = uid_base + os.getpid() % 50_000 if os.geteuid() == 0 else -1
        policy = Policy.default(packages=(), extra_read_only=[scratch], memory_bytes=memory_bytes)
        argv = [sys.executable, "-I", "-"]
        env = probe_env()
        args_fd = None
        if sandbox:  # the policy in a memfd, as for the kernels: /proc/1/cmdline shows no host path
            command, args_fd = with_args_fd(policy.command(argv, workdir=scratch, env=env, uid=uid))
        else:
            command = argv
        read_end, write_end = os.pipe()
        with tempfile.TemporaryFile() as errors, tempfile.TemporaryFile() as source:
            source.write(script.encode("utf-8"))
            source.seek(0)
            try:
                proc = subprocess.Popen(command, cwd=scratch, env={"PATH": os.defpath} if sandbox else
                                        {**env, "PATH": os.defpath}, stdin=source, stdout=write_end, stderr=errors,
                                        pass_fds=() if args_fd is None else (args_fd,), start_new_session=True)
            finally:
                os.close(write_end)
                if args_fd is not None:
                    os.close(args_fd)
            try:
                _follow(proc, read_end, run, cell_timeout + grace + 2, total_timeout, max_bytes)
            finally:
                os.close(read_end)
                _kill(proc)
                errors.seek(max(0, errors.seek(0, os.SEEK_END) - 2000))
                run.log = errors.read().decode("utf-8", "replace")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return run


def _follow(proc: subprocess.Popen, fd: int, run: Run, step_limit: float, total_timeout: float,
            max_bytes: int) -> None:
    """Read the driver's reports until it is done, dies, or passes a limit (the grader's clock, see run_steps).

    A report is accepted only for the step the grader waits for, in order, and only in the driver's exact form;
    every other line is ignored. The student's code can forge a well-formed report for that step: it then ends
    that step early (never later), with data the grader checks as it checks the probe's own."""
    start = monotonic()
    step_deadline = start + step_limit  # the interpreter's own start counts as part of the first step
    current = 0  # the step the grader waits for
    received, buffer = 0, b""
    while True:
        now = monotonic()
        if now >= start + total_timeout or now >= step_deadline:
            if current < len(run.outcomes):
                run.outcomes[current].error = TIMED_OUT
            run.stopped = "the program ran past the grader's time limit" if now >= start + total_timeout else \
                "a step ran past the grader's time limit (its interrupt ignored); the grader ended the program"
            return
        ready, _, _ = select.select([fd], [], [], min(step_deadline, start + total_timeout) - now)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:  # every writer is gone: the program ended
            if run.stopped is None and not run.done:
                run.stopped = "the program ended before every step ran"
            return
        received += len(chunk)
        if received > max_bytes:
            run.stopped = f"the program sent more than {max_bytes} bytes"
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            report = _report(line)
            if report is None:
                continue
            if report.get("done") is True and len(report) == 1:
                run.done = current == len(run.outcomes)
                if not run.done:
                    run.stopped = "the program ended before every step ran"
                return
            if report.get("step") != current or current >= len(run.outcomes):
                continue  # not the step the grader waits for: a forged or a late line
            outcome = run.outcomes[current]
            if set(report) == {"step"}:  # a cell ran to its end
                pass
            elif set(report) == {"step", "result"}:
                outcome.result = report["result"]
            elif set(report) == {"step", "failed", "type"} and report["failed"] in FAILURES \
                    and type(report["type"]) is str:
                name = report["type"]
                if report["failed"] == "missing":
                    name = repr(name) if IDENTIFIER.fullmatch(name) else "a name the probe needs"
                else:
                    name = known_name(name)
                outcome.error = FAILURES[report["failed"]].format(name=name)
            else:
                continue
            outcome.ran = True
            current += 1
            step_deadline = monotonic() + step_limit


def _report(line: bytes) -> dict | None:
    """A line as the driver writes it (a JSON object with an int step), else None."""
    try:
        report = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(report, dict):
        return None
    if "step" in report and type(report["step"]) is not int:
        return None
    return report


def _kill(proc: subprocess.Popen) -> None:
    """End bubblewrap's whole process group (the sandbox's pid namespace dies with its first process)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
