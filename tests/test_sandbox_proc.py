"""What a sandboxed kernel learns about its sandbox from /proc (grading/sandbox.py): none of bubblewrap's
policy (the host paths it binds, hides or sets) and none of the grader's environment. bwrap must be installed.

The kernel reads every process's cmdline and environ it can see in its pid namespace (/proc/1 is bubblewrap's
reaper), and its own open descriptors; the test looks there for the policy's options, a folder the policy hides,
and a variable set only in the grader's environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from grading.sandbox import SandboxKernelManager, with_args_fd

PROBE = """\
import json, os, stat
seen = {}
for pid in sorted(p for p in os.listdir('/proc') if p.isdigit()):
    for what in ('cmdline', 'environ'):
        try:
            seen[f'{pid}/{what}'] = open(f'/proc/{pid}/{what}', 'rb').read().decode(errors='replace')
        except OSError as error:
            seen[f'{pid}/{what}'] = f'unreadable: {type(error).__name__}'
for fd in os.listdir('/proc/self/fd'):
    try:
        seen[f'fd {fd}'] = os.readlink(f'/proc/self/fd/{fd}')
        if stat.S_ISREG(os.stat(f'/proc/self/fd/{fd}').st_mode):  # a file or a memfd (a pipe's read would block)
            seen[f'fd {fd} data'] = open(f'/proc/self/fd/{fd}', 'rb').read(1 << 16).decode(errors='replace')
    except OSError:
        pass
print(json.dumps(seen))
"""


async def probe(cwd: Path, hidden: Path) -> dict[str, str]:
    km = SandboxKernelManager(hidden=[str(hidden)])
    await km.start_kernel(cwd=str(cwd))
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        out: list[str] = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        await kc.execute_interactive(PROBE, timeout=60, output_hook=hook)
        # and from outside: bubblewrap's own environment (the sandbox's pid 1 is a copy of this process)
        bwrap_environ = Path(f"/proc/{km.provisioner.process.pid}/environ").read_bytes().decode(errors="replace")
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
    return {**json.loads("".join(out)), "bubblewrap's environ, from outside": bwrap_environ}


@pytest.fixture()
def seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, str], str, Path]:
    assert shutil.which("bwrap"), "bubblewrap is not installed (apt-get install bubblewrap)"
    token = f"GRADER-ONLY-{uuid.uuid4().hex}"
    monkeypatch.setenv("MINIALLOC_GRADER_SECRET", token)  # not among the variables the kernel gets
    hidden = Path(__file__).resolve().parent / "fixtures"  # a folder of the repository the kernel must not list
    work = tmp_path / "work"
    work.mkdir()
    for folder in (tmp_path, work):
        folder.chmod(0o755)
    return asyncio.run(probe(work, hidden)), token, hidden


def test_no_process_in_the_sandbox_shows_the_policy(seen):
    found, _, hidden = seen
    cmdlines = {k: v for k, v in found.items() if k.endswith("/cmdline")}
    first = cmdlines["1/cmdline"].split("\0")
    assert Path(first[0]).name == "bwrap" and first[1] == "--args" and first[2].isdigit() and first[3] == "--", first
    for where, text in found.items():
        for option in ("--ro-bind", "--bind", "--tmpfs", "--setenv", "--symlink", str(hidden)):
            assert option not in text, f"{where} shows {option!r}"


def test_no_process_in_the_sandbox_holds_the_graders_environment(seen):
    found, token, _ = seen
    assert not [where for where, text in found.items() if token in text]
    names = {v.split("=", 1)[0] for v in found["bubblewrap's environ, from outside"].split("\0") if v}
    assert names <= {"PATH", "JPY_PARENT_PID"}, names


def test_the_options_travel_in_a_descriptor_bwrap_reads():
    fd = None
    try:
        cmd, fd = with_args_fd(["bwrap", "--ro-bind", "/usr", "/usr", "--chdir", "/", "--", "python", "-c", "1"])
        assert cmd == ["bwrap", "--args", str(fd), "--", "python", "-c", "1"]
        assert os.read(fd, 1 << 10) == b"--ro-bind\0/usr\0/usr\0--chdir\0/\0"
    finally:
        if fd is not None:
            os.close(fd)
