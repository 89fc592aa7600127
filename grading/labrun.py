"""Run a lab's answers in a fresh sandboxed process and read back what its probes return, as data.

`run_steps` starts grading/labdriver.py under the bubblewrap policy of grading.sandbox (no network,
its own pid namespace, the memory and process limits, nothing of the grader's files), with:
- a grading copy of minialloc (`grading_package`): the simulated device, sizes and workloads, which the labs'
  answers legitimately use; every other public name (CachingAllocator, ExpandableSegment, BlockManager, the OOM
  report...) is a placeholder that raises `Withheld` when used, and their modules are not there to read or exec;
- the steps (cells and probes) in a JSON file, and a pipe on which the driver writes one JSON object a line.

The grader enforces the limits from outside as well: a step that runs past its timeout plus the grace is killed
with the whole sandbox, and so is a program past `total_timeout` or one that sends more than `max_bytes`.
"""

from __future__ import annotations

import importlib.util
import json
import os
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

from .privacy import scratch_root
from .sandbox import Policy

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


@dataclass
class Outcome:
    """What happened to one step: `ran` (its end was reported), `result` (a probe's data) or `error` (a message)."""

    ran: bool = False
    result: object = None
    error: str | None = None


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    stopped: str | None = None  # why the program ended early (killed, timed out, too much output), if it did
    log: str = ""  # the end of the driver's own error stream, for the grader's log
    done: bool = False  # the driver reported that every step ran


def run_steps(steps: Sequence[Step], probes_source: str, *, cell_timeout: float, grace: float,
              total_timeout: float, max_bytes: int = 8 * 1024**2, memory_bytes: int = 3 * 1024**3,
              uid_base: int = 300_000, sandbox: bool = True) -> Run:
    """Run the steps in one fresh sandboxed process; the outcome of each, in order.

    `sandbox=False` (autograde already confined, GuardedExecute.sandbox off) runs the process unconfined: the
    grading copy of minialloc still comes first on its path, but the rest of the machine is readable to it.
    """
    scratch = Path(tempfile.mkdtemp(prefix="minialloc-labgrade-", dir=scratch_root()))  # private: grading/privacy.py
    run = Run([Outcome() for _ in steps])
    try:
        os.chmod(scratch, 0o755)
        packages = grading_package(scratch / "packages")
        shutil.copyfile(DRIVER, scratch / "labdriver.py")
        spec = {"packages": str(packages), "probes": probes_source, "cell_timeout": cell_timeout, "grace": grace,
                "steps": [s.as_json() for s in steps]}
        (scratch / "input.json").write_text(json.dumps(spec), encoding="utf-8")
        for folder, dirs, files in os.walk(scratch):  # readable by the sandbox's own user id, writable by none
            for name in dirs:
                os.chmod(os.path.join(folder, name), 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        uid = uid_base + os.getpid() % 50_000 if os.geteuid() == 0 else -1
        policy = Policy.default(packages=(), extra_read_only=[scratch], memory_bytes=memory_bytes)
        read_end, write_end = os.pipe()
        argv = [sys.executable, "-I", str(scratch / "labdriver.py"), str(scratch / "input.json"), str(write_end)]
        env = {"PYTHONHASHSEED": "0", "MINIALLOC_DEVICE": "sim", "MPLBACKEND": "Agg"}
        with tempfile.TemporaryFile() as errors:
            command = policy.command(argv, workdir=scratch, env=env, uid=uid) if sandbox else argv
            proc = subprocess.Popen(command, cwd=scratch, env=None if sandbox else {**env, "PATH": os.defpath},
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                                    pass_fds=(write_end,), start_new_session=True)
            os.close(write_end)
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
    """Read the driver's messages until it is done, dies, or passes a limit."""
    start = monotonic()
    step_deadline = start + step_limit  # the interpreter's own start counts as a step
    received, buffer = 0, b""
    while True:
        now = monotonic()
        deadline = min(step_deadline, start + total_timeout)
        if now >= deadline:
            run.stopped = "the program ran past the grader's time limit" if now >= start + total_timeout else \
                "a step ignored its interrupt; the grader ended the program"
            return
        ready, _, _ = select.select([fd], [], [], deadline - now)
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
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):
                continue  # not the driver's: the student's code wrote to the channel
            if not isinstance(message, dict):
                continue
            if message.get("event") == "done":
                run.done = True
                return
            index = message.get("step")
            if type(index) is not int or not 0 <= index < len(run.outcomes):
                continue
            outcome = run.outcomes[index]
            if outcome.ran:
                continue  # the first report of a step counts
            event = message.get("event")
            if event == "start":
                step_deadline = monotonic() + step_limit
            elif event == "end":
                outcome.ran = True
                outcome.result = message.get("result")
                error = message.get("error")
                outcome.error = str(error)[:300] if error is not None else None
            elif event == "killed":
                outcome.error = "CellTimeoutError: the cell ignored the interrupt after its timeout"
                run.stopped = "a cell ignored the interrupt after its timeout; the program was ended"


def _kill(proc: subprocess.Popen) -> None:
    """End bubblewrap's whole process group (the sandbox's pid namespace dies with its first process)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
