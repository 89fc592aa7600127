"""The grader's files stay the grader's: checks that refuse a grading command, a private umask, a private scratch.

On a machine students log in to (a JupyterHub, a lab server), whatever the grading commands write can be read by
every account unless something says otherwise: `useradd -m` makes 0755 homes, git, nbgrader and sqlite write 0644
files, and `tempfile.mkdtemp` folders made readable for a sandboxed kernel sit in the shared /tmp. A student who
reads the course directory reads the solutions and hidden tests (source/), every submission and its
submission_secret.txt (submitted/), everyone's graded notebook and feedback, and the gradebook; one who reads the
private bank or the issuer key can forge a quiz answer or a certificate. So:

1. Every grading command checks, before it starts, that no other account can read the course directory, the
   gradebook, the graded quiz's private bank or the keys (`check`), and refuses with the one command that fixes
   the first path it finds (`exposed`: what a student can reach, walking from / the way the kernel does).
2. It runs with the umask 077 (`private_umask`): what it writes is its user's alone, whatever the login's umask.
3. The grader's scratch (the sandbox's copy of a submission, the lab grading program's input) lives in a folder of
   the shared temporary directory that only the grader can enter (`scratch_root`), never in a world-readable one.

`install()` (called by the repository's nbgrader_config.py) wraps the start of nbgrader's converters
(generate_assignment, autograde, generate_feedback: nbgrader.converters.base.BaseConverter.start) and of the
exchange steps that read or hand out the course's files (collect, release_assignment, release_feedback:
nbgrader.exchange.default.exchange.Exchange.start): nbgrader has no setting for a check before a command runs.
Students' own commands (fetch, submit, list) are not wrapped; students do not load this configuration anyway.
"""

from __future__ import annotations

import contextlib
import functools
import grp
import os
import pwd
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

PRIVATE_UMASK = 0o077


class NotPrivate(Exception):
    """A path the grader keeps private can be read by another account; the message says how to fix it."""


def _group_is_shared(gid: int, owner: int) -> bool:
    """Whether the group holds an account other than the file's owner (a user's own group does not count)."""
    try:
        group = grp.getgrgid(gid)
    except KeyError:
        return True  # a group with no name: nobody can say who is in it
    members = set(group.gr_mem)
    try:
        name = pwd.getpwuid(owner)
        members.discard(name.pw_name)
        others_primary = any(p.pw_gid == gid and p.pw_uid != owner for p in pwd.getpwall())
    except KeyError:
        others_primary = True
    return bool(members) or others_primary


def _others_may(info: os.stat_result, other_bit: int, group_bit: int) -> bool:
    return bool(info.st_mode & other_bit) or (bool(info.st_mode & group_bit)
                                              and _group_is_shared(info.st_gid, info.st_uid))


def exposed(path: Path | str) -> Path | None:
    """The folder or file through which another account (not root, not the owner) can read `path`, or None.

    None when some folder on the way from / cannot be entered by others (`chmod 700` on a home protects all in
    it) or when `path` itself cannot be read by them. A path that does not exist is not exposed."""
    path = Path(os.path.abspath(os.path.expanduser(str(path))))
    try:
        target = os.stat(path)
    except FileNotFoundError:
        return None
    for folder in reversed(path.parents):  # from / down: each must let others in (search) for them to reach path
        if not _others_may(os.stat(folder), stat.S_IXOTH, stat.S_IXGRP):
            return None
    if stat.S_ISDIR(target.st_mode):
        readable = _others_may(target, stat.S_IXOTH | stat.S_IROTH, stat.S_IXGRP | stat.S_IRGRP)
    else:
        readable = _others_may(target, stat.S_IROTH, stat.S_IRGRP)
    return path if readable else None


def fix_for(path: Path) -> str:
    """The one command that makes `path` the grader's alone."""
    return f"chmod go-rwx {path}" if path.is_dir() else f"chmod 600 {path}"


def check(named: Iterable[tuple[str, Path | str]]) -> None:
    """Raise NotPrivate for the first (what, path) that another account can read, with the command that fixes it."""
    for what, path in named:
        if not str(path):
            continue
        where = exposed(path)
        if where is not None:
            raise NotPrivate(f"other accounts on this machine can read {what} ({where}): run `{fix_for(where)}` "
                             "(or make the home folder private: chmod 700 ~), then run the command again")


def sqlite_file(db_url: str) -> str:
    """The file of a sqlite:/// gradebook URL ('' for another database: its server keeps it)."""
    return db_url[len("sqlite:///"):] if db_url.startswith("sqlite:///") else ""


def private_paths(coursedir, config) -> list[tuple[str, str]]:
    """What a grading command run on `coursedir` (nbgrader's CourseDirectory) with `config` keeps private."""
    named = [("the course directory", coursedir.root), ("the gradebook", sqlite_file(coursedir.db_url))]
    bank = config.get("QuizGrade", {}).get("bank_dir", "") or os.environ.get("MINIALLOC_PRIVATE_BANK", "")
    named.append(("the private bank", bank))
    named.extend(("a key", key) for key in config.get("ScanForKeys", {}).get("key_files", []))
    return named


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Everything written inside is readable by its user alone (the previous umask is restored after)."""
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def scratch_root() -> str:
    """A folder of the temporary directory that only this user can enter, for the grader's scratch folders.

    `minialloc-grader-<uid>` in tempfile.gettempdir(): made 0700 when missing; refused when it is a link, is not a
    folder, or belongs to another account (a student can make that name first in a shared /tmp)."""
    root = Path(tempfile.gettempdir()) / f"minialloc-grader-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700)
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise NotPrivate(f"{root} is not a folder of this account's: remove it (or set TMPDIR to a private folder), "
                         "then run the command again")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(root, 0o700)  # ours: made with a looser umask, or changed since
    return str(root)


def _refuse(app, message: str) -> None:
    """nbgrader's own way out: one logged line, then the command exits with status 1 (the formgrader shows it)."""
    if hasattr(app, "fail"):  # the exchange steps
        app.fail(message)
    from nbgrader.utils import NbGraderException  # the converters: their apps turn it into exit status 1
    app.log.error(message)
    raise NbGraderException(message)


def _guarded(start, applies=lambda app: True):
    @functools.wraps(start)
    def guarded_start(self, *args, **kwargs):
        if not applies(self):
            return start(self, *args, **kwargs)
        with private_umask():
            try:
                check(private_paths(self.coursedir, self.config))
                scratch_root()
            except NotPrivate as refused:
                _refuse(self, str(refused))
            return start(self, *args, **kwargs)
    guarded_start.minialloc_privacy = True
    return guarded_start


def install() -> None:
    """Wrap the grading commands' start with the checks and the private umask (once per process)."""
    from nbgrader.converters.base import BaseConverter
    from nbgrader.exchange.abc import ExchangeCollect, ExchangeReleaseAssignment, ExchangeReleaseFeedback
    from nbgrader.exchange.default.exchange import Exchange

    def grading_step(app) -> bool:
        return isinstance(app, (ExchangeCollect, ExchangeReleaseAssignment, ExchangeReleaseFeedback))

    for cls, applies in ((BaseConverter, lambda app: True), (Exchange, grading_step)):
        if not getattr(cls.start, "minialloc_privacy", False):
            cls.start = _guarded(cls.start, applies)
