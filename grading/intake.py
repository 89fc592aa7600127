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
  notebook is read), and a notebook over a size or a markdown cap refused. nbgrader 0.9 builds its Autograde
  (and its GenerateFeedback) by name, with no setting for the class, so `install()` (called by
  nbgrader_config.py) makes the names point to this subclass (and to grading.feedback's
  TimedGenerateFeedback) in nbgrader's apps and NbGraderAPI.
- `CheckedCollect`: nbgrader's default ExchangeCollect, installed with `c.ExchangeFactory.collect`. It refuses
  (not warns, as nbgrader does) a submission whose exchange folder is not owned by the user its name claims:
  on one machine a student id is the submitting user's login name, so `alice+lab1+<time>` must belong to the
  user id whose name (pwd) is `alice`. A refused folder is skipped before nbgrader picks each student's latest
  submission, so mallory's later `alice+...` folder cannot replace alice's own. The copy itself is
  grading.safe_copy's (no link followed even when one is swapped in during the copy), checked again on
  the copy it made.

Student ids and assignment names are validated where they enter (collect, autograde): SAFE_ID, one safe
character set that cannot be a glob (`*`), a CSV field separator, a path (`..`, `/`), markup (`<`) or a
spreadsheet formula (`=`, `+`, `-`, `@` first). A refused id is named (escaped) in a one-line error and the rest
of the batch is graded.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import re
import shutil
import stat
from collections import defaultdict
from pathlib import Path

from nbgrader.converters.autograde import Autograde
from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.utils import parse_utc
from traitlets import Integer

from grading.safe_copy import CopyRefused, CopyRules, copy_folder

# 1 to 64 characters, letters, digits, '_', '.', '-', the first a letter or a digit: no glob, separator, markup,
# path or formula character can be in an id; '..' is refused on its own (a path's parent).
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
ID_RULE = ("an id is 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or a digit, without '..'")


class SubmissionRefused(Exception):
    """A submission the grader does not read: an unsafe id, or a folder holding something other than folders
    and regular files of its own."""


def id_problem(kind: str, value: object) -> str | None:
    """Why `value` may not be used as a `kind` ("student id", "assignment name"), or None when it may."""
    if isinstance(value, str) and SAFE_ID.fullmatch(value) and ".." not in value:
        return None
    shown = ascii(value if isinstance(value, str) else repr(value))
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return f"{kind} {shown} refused: {ID_RULE}"


def check_ids(student_id: object, assignment_id: object) -> None:
    """Raise SubmissionRefused naming the first unsafe id."""
    for kind, value in (("student id", student_id), ("assignment name", assignment_id)):
        if (problem := id_problem(kind, value)) is not None:
            raise SubmissionRefused(f"{problem}; nothing of this submission was read or graded")


def owner_name(uid: int) -> str | None:
    """The login name of user id `uid` on this machine (the student id it may submit as), None if it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


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


def markdown_chars(notebook: str) -> int:
    """Characters in the markdown cells of the notebook file `notebook` (0 if it is not a notebook: nbgrader then
    fails that student's autograde with its own message)."""
    try:
        with open(notebook, "rb") as handle:
            cells = json.load(handle).get("cells", [])
        sources = [c.get("source", "") for c in cells if isinstance(c, dict) and c.get("cell_type") == "markdown"]
    except (ValueError, AttributeError, OSError):
        return 0
    return sum(len("".join(map(str, s))) if isinstance(s, list) else len(str(s)) for s in sources)


def largest_code_cell(notebook: str) -> tuple[int, str]:
    """(characters, how to name it) of the largest code cell of the notebook file `notebook`; (0, "") if it is not
    a notebook. The name is the cell's grade id, else its id, else its number, as ascii() writes it."""
    try:
        with open(notebook, "rb") as handle:
            cells = json.load(handle).get("cells", [])
    except (ValueError, AttributeError, OSError):
        return 0, ""
    largest, name = 0, ""
    for number, cell in enumerate(cells if isinstance(cells, list) else []):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        chars = len("".join(map(str, source))) if isinstance(source, list) else len(str(source))
        if chars > largest:
            meta = cell.get("metadata", {})
            grade_id = meta.get("nbgrader", {}).get("grade_id") if isinstance(meta, dict) and \
                isinstance(meta.get("nbgrader"), dict) else None
            label = grade_id or cell.get("id") or ""
            largest, name = chars, f"{ascii(str(label))} (cell {number + 1})" if label else f"cell {number + 1}"
    return largest, name


class CheckedAutograde(Autograde):
    """nbgrader's Autograde that refuses, per student, an unsafe id, a folder holding links or special files, a
    notebook larger than max_notebook_bytes, one whose markdown holds more than max_markdown_chars, or one with a
    code cell larger than max_code_cell_chars (the refusal names the cell).

    The check runs first in init_destination (before nbgrader reads the submission's timestamp.txt, copies its
    files or opens its notebooks) and again in init_assignment; SubmissionRefused is an ordinary exception, so
    nbgrader logs it for that student, removes the student's autograded folder, grades the others, and reports
    the run as failed. The ids checked are the ones nbgrader parsed from the folder's path: a folder named `*`
    would otherwise be globbed as every student's.
    """

    max_notebook_bytes = Integer(
        10_000_000, help="A submitted notebook larger than this is refused before nbgrader reads it (0: no limit)."
    ).tag(config=True)

    max_markdown_chars = Integer(
        200_000, help=("A submitted notebook whose markdown cells hold more characters than this is refused: "
                       "rendering markdown (the grader's check, the feedback) takes time in proportion, about 9 s "
                       "per 200 000 characters of the worst text tried (0: no limit).")
    ).tag(config=True)

    max_code_cell_chars = Integer(
        50_000, help=("A submitted notebook with a code cell of more characters than this is refused, naming the "
                      "cell: the formgrader highlights a code cell's text in the server's event loop, in time that "
                      "grows with it (1.5 MB of `x = 1` held every request for 260 s), 0: no limit.")
    ).tag(config=True)

    def _check(self, assignment_id: str, student_id: str) -> None:
        check_ids(student_id, assignment_id)
        submitted = self.coursedir.format_path(self.coursedir.submitted_directory, student_id, assignment_id)
        check_submission(submitted, self.coursedir.root)
        if not os.path.isdir(submitted):
            return  # nbgrader says what is missing
        for entry in os.scandir(submitted):
            if not entry.name.endswith(".ipynb"):
                continue
            size = entry.stat(follow_symlinks=False).st_size
            if self.max_notebook_bytes and size > self.max_notebook_bytes:
                raise SubmissionRefused(
                    f"submission {ascii(submitted)} refused: {ascii(entry.name)} holds {size} bytes, more than "
                    f"Autograde.max_notebook_bytes ({self.max_notebook_bytes}); nothing of it was graded")
            if self.max_markdown_chars and (chars := markdown_chars(entry.path)) > self.max_markdown_chars:
                raise SubmissionRefused(
                    f"submission {ascii(submitted)} refused: the markdown cells of {ascii(entry.name)} hold {chars} "
                    f"characters, more than Autograde.max_markdown_chars ({self.max_markdown_chars}); nothing of it "
                    "was graded")
            if self.max_code_cell_chars and (found := largest_code_cell(entry.path))[0] > self.max_code_cell_chars:
                raise SubmissionRefused(
                    f"submission {ascii(submitted)} refused: code cell {found[1]} of {ascii(entry.name)} holds "
                    f"{found[0]} characters, more than Autograde.max_code_cell_chars ({self.max_code_cell_chars}); "
                    "nothing of it was graded")

    def init_destination(self, assignment_id: str, student_id: str) -> bool:
        self._check(assignment_id, student_id)
        return super().init_destination(assignment_id, student_id)

    def init_assignment(self, assignment_id: str, student_id: str) -> None:
        self._check(assignment_id, student_id)
        super().init_assignment(assignment_id, student_id)


class CheckedCollect(ExchangeCollect):
    """nbgrader's collect that refuses, per submission and with the reason in the log as an error: a folder name
    that does not parse or names an unsafe id, a folder not owned by the student it names, and a folder holding
    anything but the student's own folders and regular files (checked on the descriptors the copy reads, and
    again on the copy). The refused submission is left in the exchange; the others are collected.
    """

    def _record(self, path: str) -> dict | None:
        """nbgrader's _path_to_record, refusing (None, logged) instead of failing the whole collect."""
        filename = os.path.basename(path)
        parts = filename.rsplit("+", 3)
        try:
            if len(parts) < 3:
                raise ValueError("not <student>+<assignment>+<timestamp>")
            check_ids(parts[0], parts[1])
            timestamp = parse_utc(parts[2])
        except (ValueError, OverflowError, SubmissionRefused) as error:
            self.log.error("Not collected: exchange folder %s: %s", ascii(filename), error)
            return None
        try:
            info = os.lstat(path)
        except OSError as error:  # removed since it was listed
            self.log.error("Not collected: exchange folder %s: %s", ascii(filename), error.strerror)
            return None
        if not stat.S_ISDIR(info.st_mode):
            self.log.error("Not collected: exchange folder %s is not a folder (a link or a special file)",
                           ascii(filename))
            return None
        if self.check_owner:
            owner = owner_name(info.st_uid)
            if owner != parts[0]:
                self.log.error("Not collected: exchange folder %s names student %s but belongs to %s (user id %d): "
                               "only a student's own folder is collected as theirs", ascii(filename),
                               ascii(parts[0]), ascii(owner or "no user"), info.st_uid)
                return None
        return {"username": parts[0], "filename": filename, "timestamp": timestamp}

    def init_src(self):
        # nbgrader 0.9's ExchangeCollect.init_src (exchange/default/collect.py), with each folder checked before
        # the latest of each student is picked, and the course's and assignment's names checked first
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        for kind, value in (("course id", self.coursedir.course_id),
                            ("assignment name", self.coursedir.assignment_id)):
            if (problem := id_problem(kind, value)) is not None:
                self.fail(problem)
        student_id = self.coursedir.student_id or "*"
        if student_id != "*" and (problem := id_problem("student id", student_id)) is not None:
            self.fail(problem)
        if not self.check_owner:
            self.log.warning("CollectApp.check_owner is off: a student can submit under another student's id")
        self.course_path = os.path.join(self.root, self.coursedir.course_id)
        self.inbound_path = os.path.join(self.course_path, "inbound")
        if not os.path.isdir(self.inbound_path):
            self.fail(f"Course not found: {self.inbound_path}")
        pattern = os.path.join(glob.escape(self.inbound_path),
                               f"{student_id}+{glob.escape(self.coursedir.assignment_id)}+*")
        by_student: dict[str, list[dict]] = defaultdict(list)
        for path in sorted(glob.glob(pattern)):
            if (record := self._record(path)) is not None:
                by_student[record["username"]].append(record)
        self.duedate = self._duedate()
        self.src_records = []
        for records in by_student.values():
            records = self._sort_by_timestamp(records)
            if self.duedate is not None and self.before_duedate:
                records = [r for r in records if r["timestamp"] <= self.duedate] or records
            self.src_records.append(records[0])

    def _duedate(self):
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                return gb.find_assignment(self.coursedir.assignment_id).duedate
            except MissingEntry:
                return None

    def do_copy(self, src, dest, log=None):
        student_id = os.path.basename(src).rsplit("+", 3)[0]
        owner = group = None
        if self.check_owner:  # the student's user, from their id (not from the folder, which may be swapped)
            try:
                account = pwd.getpwnam(student_id)
            except KeyError:
                self.log.error("Not collected: %s is no user of this machine", ascii(student_id))
                return
            owner, group = account.pw_uid, account.pw_gid
        rules = CopyRules(ignore=tuple(self.coursedir.ignore), include=tuple(self.coursedir.include),
                          max_file_bytes=1000 * self.coursedir.max_file_size,
                          max_total_bytes=1000 * self.coursedir.max_dir_size)
        try:
            copy_folder(src, dest, owner=owner, group=group, rules=rules, log=self.log)
            check_submission(dest)  # the copy it made, not the source
        except (CopyRefused, SubmissionRefused, OSError) as refused:
            shutil.rmtree(dest, ignore_errors=True)
            self.log.error("Not collected: %s's submission %s: %s", ascii(student_id), ascii(os.path.basename(src)),
                           refused)


def checked_api_class():
    """NbGraderAPI (what the formgrader and scripts call) that does not list a student whose id is unsafe.

    The formgrader lists the students that have a folder in submitted/ by the folder's name, and its templates
    print that name: collect and autograde never make such a folder, but one copied in by hand is dropped from
    the lists here, with its reason in the log. Built on first use, so that importing this module does not import
    nbgrader's API."""
    from nbgrader.apps.api import NbGraderAPI

    class CheckedNbGraderAPI(NbGraderAPI):
        def _safe(self, students: set[str]) -> set[str]:
            unsafe = {s for s in students if id_problem("student id", s) is not None}
            for student in sorted(unsafe):
                self.log.error("Not listed: %s", id_problem("student id", student))
            return students - unsafe

        def get_submitted_students(self, assignment_id):
            return self._safe(super().get_submitted_students(assignment_id))

        def get_autograded_students(self, assignment_id):
            return self._safe(super().get_autograded_students(assignment_id))

    return CheckedNbGraderAPI


_api_class = None


def install() -> None:
    """Make nbgrader's autograde and generate_feedback (the commands and NbGraderAPI, the formgrader's too) use
    CheckedAutograde and grading.feedback's TimedGenerateFeedback, and the formgrader (when it is the one
    loading this configuration) use the API of checked_api_class(); and escape every log record of the process
(grading/escape.py)."""
    import sys

    from nbgrader.apps import api, autogradeapp, generatefeedbackapp
    from nbgrader.converters.generate_feedback import GenerateFeedback

    from grading.escape import install_log_escaper
    from grading.feedback import TimedGenerateFeedback

    install_log_escaper()  # every log line of the grader's process: no student's control character sent raw
    global _api_class
    for modules, name, upstream, ours in (((api, autogradeapp), "Autograde", Autograde, CheckedAutograde),
                                          ((api, generatefeedbackapp), "GenerateFeedback", GenerateFeedback,
                                           TimedGenerateFeedback)):
        for module in modules:
            if getattr(module, name, None) not in (upstream, ours):
                raise RuntimeError(f"{module.__name__}.{name} is not nbgrader's {name}: the grader's checks cannot "
                                   "be installed (nbgrader changed?)")
            setattr(module, name, ours)
    formgrader = sys.modules.get("nbgrader.server_extensions.formgrader.base")
    if formgrader is not None:  # the formgrader loads the configuration before it makes each API object
        _api_class = _api_class or checked_api_class()
        if formgrader.NbGraderAPI not in (api.NbGraderAPI, _api_class):
            raise RuntimeError("the formgrader's NbGraderAPI is not nbgrader's: the id check cannot be installed")
        formgrader.NbGraderAPI = _api_class
