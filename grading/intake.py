"""What the grader accepts from a student's folder before it reads anything in it.

nbgrader 0.9's autograde copies a submission's extra files with shutil.copy and reads its notebooks with open():
both follow symbolic links, as the user who grades (root in CI). A submission folder holding `notes.txt ->
~/.minialloc-issuer/issuer-ed25519.pem` would hand the key to the student's kernel; a notebook that is a link to
the source notebook would be graded as the instructor's solution. `nbgrader collect` copies the exchange's
inbound folders with shutil.copytree, which follows links too (the inbound folder is writable by every student).

The rule, for autograde and collect alike: a folder that holds anything but folders and regular files (a
symbolic link, a FIFO, a socket, a device), or a regular file with more than one hard link (a hard link can name
a file outside the folder), is refused for that student, with a message naming what was found. Nothing in it is
read, copied or executed; the other students are graded as usual. Refusing, rather than dropping the links and
grading the rest, because a submission with a link in it was not made by the course's tools: the instructor
should look at it (and dropping files would grade something the student did not submit).

- `CheckedAutograde`: nbgrader's Autograde with the check first (before the timestamp, the copy or the
  notebook is read). nbgrader 0.9 builds its Autograde by name, with no setting for the class, so `install()`
  (called by nbgrader_config.py) makes the name point to this subclass in nbgrader's two apps.
- `CheckedCollect`: nbgrader's default ExchangeCollect with the same check before each copy; installed with
  `c.ExchangeFactory.collect`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nbgrader.converters.autograde import Autograde
from nbgrader.exchange.default.collect import ExchangeCollect


class SubmissionRefused(Exception):
    """A submission folder that holds something other than folders and regular files of its own."""


def _shown(path: Path | str, root: Path | str) -> str:
    # the names are the student's: escaped (control characters, bidi overrides) before they reach a log
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        rel = str(path)
    return ascii(rel)


def folder_problems(folder: Path | str, limit: int = 20) -> list[str]:
    """Why `folder` may not be graded: what in it (the folder itself included) is not a folder or a regular file
    of its own. Reads no file and follows no link (lstat only)."""
    folder = Path(folder)
    problems: list[str] = []
    try:
        top = os.lstat(folder)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(top.st_mode):
        return [f"{ascii(str(folder))} is not a folder (a link or a special file)"]
    pending = [folder]
    while pending and len(problems) < limit:
        current = pending.pop()
        try:
            entries = list(os.scandir(current))
        except OSError as error:
            problems.append(f"{_shown(current, folder)} cannot be listed ({type(error).__name__})")
            continue
        for entry in entries:
            info = entry.stat(follow_symlinks=False)
            name = _shown(entry.path, folder)
            if stat.S_ISLNK(info.st_mode):
                problems.append(f"{name} is a symbolic link")
            elif stat.S_ISDIR(info.st_mode):
                pending.append(Path(entry.path))
            elif not stat.S_ISREG(info.st_mode):
                problems.append(f"{name} is not a regular file")
            elif info.st_nlink > 1:
                problems.append(f"{name} has {info.st_nlink} hard links (it may be a file outside the folder)")
    return problems[:limit]


def path_problems(path: Path | str, below: Path | str) -> list[str]:
    """Links among the components of `path` below the folder `below` (submitted/<student> a link, say)."""
    path, below = Path(os.path.abspath(path)), Path(os.path.abspath(below))
    if below not in path.parents:
        return []
    problems = []
    for part in [*reversed(path.parents), path]:
        if below not in part.parents:
            continue
        try:
            mode = os.lstat(part).st_mode
        except FileNotFoundError:
            break
        if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            problems.append(f"{_shown(part, below)} is not a folder (a link or a special file)")
    return problems


def check_submission(folder: Path | str, course_root: Path | str | None = None) -> None:
    """Raise SubmissionRefused when `folder` (one student's submission) may not be read by the grader."""
    problems = (path_problems(folder, course_root) if course_root else []) + folder_problems(folder)
    if problems:
        raise SubmissionRefused(
            f"submission {ascii(str(folder))} refused, nothing in it was read or graded: "
            + "; ".join(problems)
            + ". A submission may hold only folders and regular files of its own; re-collect it, or copy its "
              "regular files into a fresh folder and grade that.")


class CheckedAutograde(Autograde):
    """nbgrader's Autograde that refuses a submission folder holding links or special files, per student.

    The check runs first in init_destination (before nbgrader reads the submission's timestamp.txt, copies its
    files or opens its notebooks) and again in init_assignment; SubmissionRefused is an ordinary exception, so
    nbgrader logs it for that student, removes the student's autograded folder, grades the others, and reports
    the run as failed.
    """

    def _check(self, assignment_id: str, student_id: str) -> None:
        submitted = self.coursedir.format_path(self.coursedir.submitted_directory, student_id, assignment_id)
        check_submission(submitted, self.coursedir.root)

    def init_destination(self, assignment_id: str, student_id: str) -> bool:
        self._check(assignment_id, student_id)
        return super().init_destination(assignment_id, student_id)

    def init_assignment(self, assignment_id: str, student_id: str) -> None:
        self._check(assignment_id, student_id)
        super().init_assignment(assignment_id, student_id)


class CheckedCollect(ExchangeCollect):
    """nbgrader's collect that does not copy an inbound submission holding links or special files.

    The refused submission is named in the log as an error and left in the exchange; the others are collected.
    """

    def do_copy(self, src, dest, log=None):
        try:
            check_submission(src)
        except SubmissionRefused as refused:
            self.log.error("Not collected: %s", refused)
            return
        super().do_copy(src, dest, log)


def install() -> None:
    """Make nbgrader's autograde (the command and NbGraderAPI, the formgrader's too) use CheckedAutograde."""
    from nbgrader.apps import api, autogradeapp

    for module in (api, autogradeapp):
        if getattr(module, "Autograde", None) not in (Autograde, CheckedAutograde):
            raise RuntimeError(f"{module.__name__}.Autograde is not nbgrader's Autograde: the submission check "
                               "cannot be installed (nbgrader changed?)")
        module.Autograde = CheckedAutograde
