"""Copy a student's folder out of the exchange without following a link, even one swapped in during the copy.

A check that looks at the source (lstat) and a copy that then opens it by name (shutil.copytree) leave a window:
a process of the student's swaps a checked file for a symbolic link to the course secret between the two, and
the copy reads the secret as the grader. Here every entry is opened relative to its folder's descriptor with
O_NOFOLLOW (a link is refused by the kernel, not by a check), the descriptor is checked with fstat (the thing
opened, not the name), and the bytes are copied from that descriptor. A hard link is refused by its link count
and by its owner: every entry must belong to the student who submitted (files of the instructor's cannot be
made the student's). When the copy runs as root, each source entry is opened with the student's own user and
group ids (seteuid), so the kernel's permission check is the student's as well: what the student may not read,
the copy may not open.

Anything else (a FIFO, a socket, a device, a file of another user, a folder too deep, too many files, too many
bytes) refuses the whole folder: CopyRefused names the entry, and the partial copy is removed.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import shutil
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO swapped in for a file must not wait for a writer (it is refused by fstat after)
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
CHUNK = 1 << 20


class CopyRefused(Exception):
    """The folder holds something the grader does not copy; nothing of it was kept."""


@dataclass(frozen=True)
class CopyRules:
    """What is copied: nbgrader's CourseDirectory.ignore / include globs and size limits (in bytes here)."""

    ignore: Sequence[str] = ()
    include: Sequence[str] = ("*",)
    max_file_bytes: int = 100_000_000  # a larger file is skipped with a warning, as nbgrader does
    max_total_bytes: int = 100_000_000  # a larger folder is refused
    max_entries: int = 2_000
    max_depth: int = 16


@contextlib.contextmanager
def acting_as(uid: int | None, gid: int | None) -> Iterator[None]:
    """Open files with `uid`'s rights (effective ids, no supplementary groups) when running as root; a no-op
    otherwise. The real ids stay root, so the copy can write its destination once the source is open."""
    if uid is None or os.geteuid() != 0 or uid == 0:
        yield
        return
    groups = os.getgroups()
    os.setgroups([])
    os.setegid(gid if gid is not None else uid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


def _open(name: str | Path, flags: int, parts: Sequence[str], dir_fd: int | None = None) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW met a link: swapped in after the listing
            raise CopyRefused(f"{_shown(parts)} is a symbolic link") from None
        raise CopyRefused(f"{_shown(parts)} cannot be opened ({error.strerror})") from None


def _shown(parts: Sequence[str]) -> str:
    return ascii("/".join(parts) or ".")


def _check_fd(fd: int, parts: Sequence[str], want_dir: bool, owner: int | None,
              expected: os.stat_result | None) -> os.stat_result:
    info = os.fstat(fd)
    where = _shown(parts)
    if want_dir and not stat.S_ISDIR(info.st_mode):
        raise CopyRefused(f"{where} is not a folder")
    if not want_dir and not stat.S_ISREG(info.st_mode):
        raise CopyRefused(f"{where} is not a regular file")
    if not want_dir and info.st_nlink != 1:
        raise CopyRefused(f"{where} has {info.st_nlink} hard links (it may be a file outside the folder)")
    if owner is not None and info.st_uid != owner:
        raise CopyRefused(f"{where} belongs to user id {info.st_uid}, not to the submitting student ({owner})")
    if expected is not None and (info.st_dev, info.st_ino) != (expected.st_dev, expected.st_ino):
        raise CopyRefused(f"{where} changed while it was being copied")
    return info


def copy_folder(source: Path | str, dest: Path | str, *, owner: int | None = None, group: int | None = None,
                rules: CopyRules = CopyRules(), log=None) -> int:
    """Copy the folder `source` to the new folder `dest`; return the bytes copied. Raise CopyRefused (after
    removing `dest`) when anything in `source` is not a folder or a regular, singly linked file of `owner`."""
    dest = Path(dest)
    dest.mkdir(mode=0o700)  # fails if it exists: the copy never writes into a folder it did not make
    state = {"bytes": 0, "entries": 0}
    try:
        with acting_as(owner, group):
            top = _open(source, DIR_FLAGS, [])
        try:
            _check_fd(top, [], True, owner, None)
            _copy_dir(top, dest, [], owner, group, rules, state, log)
        finally:
            os.close(top)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    os.chmod(dest, 0o755)
    return state["bytes"]


def _copy_dir(fd: int, dest: Path, parts: list[str], owner: int | None, group: int | None, rules: CopyRules,
              state: dict, log) -> None:
    if len(parts) > rules.max_depth:
        raise CopyRefused(f"{_shown(parts)} is more than {rules.max_depth} folders deep")
    with os.scandir(fd) as listing:
        entries = sorted(listing, key=lambda e: e.name)
    for entry in entries:
        state["entries"] += 1
        if state["entries"] > rules.max_entries:
            raise CopyRefused(f"more than {rules.max_entries} files and folders")
        name, here = entry.name, [*parts, entry.name]
        if any(fnmatch.fnmatch(name, glob) for glob in rules.ignore):
            continue
        info = entry.stat(follow_symlinks=False)  # of the name now; the descriptor is checked again below
        if stat.S_ISLNK(info.st_mode):
            raise CopyRefused(f"{_shown(here)} is a symbolic link")
        if stat.S_ISDIR(info.st_mode):
            with acting_as(owner, group):
                child = _open(name, DIR_FLAGS, here, fd)
            try:
                _check_fd(child, here, True, owner, info)
                (dest / name).mkdir(mode=0o755)
                _copy_dir(child, dest / name, here, owner, group, rules, state, log)
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode):
            if not any(fnmatch.fnmatch(name, glob) for glob in rules.include):
                continue
            with acting_as(owner, group):
                src = _open(name, FILE_FLAGS, here, fd)
            try:
                opened = _check_fd(src, here, False, owner, info)
                if opened.st_size > rules.max_file_bytes:
                    if log is not None:
                        log.warning("Not copied, larger than %d bytes: %s", rules.max_file_bytes, _shown(here))
                    continue
                _copy_bytes(src, dest / name, here, rules, state)
            finally:
                os.close(src)
        else:
            raise CopyRefused(f"{_shown(here)} is not a regular file (a FIFO, a socket or a device)")


def _copy_bytes(src: int, target: Path, parts: list[str], rules: CopyRules, state: dict) -> None:
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        copied = 0
        while chunk := os.read(src, CHUNK):
            copied += len(chunk)
            state["bytes"] += len(chunk)
            # counted as read, not from st_size: the student's process may grow the file during the copy
            if copied > rules.max_file_bytes or state["bytes"] > rules.max_total_bytes:
                raise CopyRefused(f"{_shown(parts)} grew past the size limit while it was copied"
                                  if copied > rules.max_file_bytes else
                                  f"the folder holds more than {rules.max_total_bytes} bytes")
            view = memoryview(chunk)
            while view:  # os.write may write less than it was given
                view = view[os.write(out, view):]
    finally:
        os.close(out)
