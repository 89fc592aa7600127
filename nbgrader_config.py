"""nbgrader configuration for minialloc's graded notebooks. Run nbgrader from the repository root.

One nbgrader course holds every graded assignment: its root is labs/, so the source notebooks live in
labs/source/<assignment>/, and nbgrader writes labs/release/, labs/submitted/, labs/autograded/,
labs/feedback/ and labs/gradebook.db (all ignored by git). Paths are computed from this file's location, so the
commands work from any clone. See labs/README.md for the instructor's commands and docs/grading.md for running
autograde safely (a container, an unprivileged user) and for what it cannot stop.

Autograde runs the students' code. Besides nbgrader's own defences (locked and test cells restored from the
gradebook, a per-cell timeout, showtraceback patches caught from the kernel's reply status), the preprocessors
defined below close the holes that tests/test_nbgrader_hostile.py found in nbgrader 0.9.6:
- a kernel that dies (os._exit, a kill, out of memory) or ignores the interrupt after a timeout no longer aborts
  the student's whole autograde: the cells that could not run fail, the rest keep their scores (GuardedExecute);
- output is capped per cell while it arrives, so printing gigabytes costs the grader no memory (GuardedExecute);
- a deleted, retyped, renamed or relabelled test cell is put back from the gradebook in its place, and no cell
  of the submission decides its own points (RestoringOverwriteCells);
- an error in a test cell scores 0 even when student code printed a number as an execute_result before the
  error, which nbgrader would take as partial credit (ErrorsFailTests);
- code that reaches into IPython or the interpreter (input transformers, event hooks, showtraceback,
  sys.modules...) is flagged for manual review in the gradebook (FlagForReview): such code can fake any result
  inside the kernel, and no grader in the same kernel can stop it.
The graded quizzes (quizzes/graded/nbgrader_config.py) load all of this with load_subconfig(<this file>) before
their own settings.
"""

import json
import os
import re
from queue import Empty
from time import monotonic

from jupyter_core.utils import ensure_async, run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.v4 import new_output
from nbgrader import utils as nbgrader_utils
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.converters.autograde import Autograde
from nbgrader.preprocessors import Execute, NbGraderPreprocessor, OverwriteCells, SaveAutoGrades
from traitlets import Integer, List, Unicode

c = get_config()  # noqa: F821 -- traitlets defines get_config() when it loads this file

REPO = os.path.dirname(os.path.abspath(__file__))


# === The grader's preprocessors (used in the settings below) =====================================================

class GuardedExecute(Execute):
    """nbgrader's Execute, with the kernel's death, an ignored interrupt and floods of output handled per cell.

    nbgrader 0.9.6 aborts a student's autograde when the kernel dies (no autograded notebook, no feedback) and
    when a timed-out cell ignores SIGINT (nbclient then raises "Timeout waiting for IOPub output"); a cell that
    ignores SIGINT would otherwise make every later cell wait out its own timeout as well. Here the cell that
    killed or hung the kernel gets an error, every later code cell gets a "not run" error (so its tests score 0),
    and the cells before keep their results. A kernel that dies before its first cell (jupyter_client chose its
    ports, and another process took one before the kernel bound it) is started again.
    """

    max_output_chars = Integer(
        100_000, help="Characters of output kept per cell while it runs (an error's traceback always kept)."
    ).tag(config=True)
    interrupt_grace = Integer(
        5, help="Seconds a timed-out, interrupted kernel has to become responsive before it is killed."
    ).tag(config=True)
    notebook_timeout = Integer(
        600, help="Seconds for the whole notebook; the cells after it are failed without running (0: no limit)."
    ).tag(config=True)

    start_retries = Integer(
        2, help="Kernel starts to retry when a kernel dies before running any cell (a port taken meanwhile)."
    ).tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        for attempt in range(self.start_retries + 1):
            self._stopped = None  # why the remaining cells cannot run, once the kernel is gone
            self._deadline = monotonic() + self.notebook_timeout if self.notebook_timeout else None
            self._output_chars = {}  # cell index -> characters kept so far
            self._started = False  # whether a cell was sent to the kernel: no retry after that
            try:
                return super().preprocess(nb, resources, km)
            except Exception as error:  # jupyter_client picks free ports before the kernel binds them: a race
                if self._started or attempt == self.start_retries:
                    raise
                self.log.warning("The kernel did not start (%s); starting another", error)
                self.km = self.kc = None

    def preprocess_cell(self, cell, resources, index):
        self._started = True
        if self._stopped is None and self._deadline is not None and monotonic() > self._deadline:
            self._stop(f"the notebook ran past the grader's limit of {self.notebook_timeout} s")
        if self._stopped is not None:
            if cell.cell_type == "code" and cell.source.strip():
                cell.outputs = [self._error("NotRun", f"not run: {self._stopped}")]
            return cell, resources
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            cell.outputs.append(self._error("DeadKernelError", "the kernel died while this cell ran"))
            self._stopped = "the kernel died in an earlier cell"
        except CellTimeoutError:  # the interrupted kernel kept running and sending nothing: SIGINT was ignored
            self._kill()
            cell.outputs.append(self._error("CellTimeoutError", "the cell ignored the interrupt after its timeout"))
            self._stopped = "an earlier cell ignored the interrupt after its timeout; the grader killed the kernel"
        else:
            timed_out = any(o.output_type == "error" and o.get("ename") == self.error_on_timeout["ename"]
                            for o in cell.get("outputs", []))
            if timed_out and not run_sync(self._responds)(self.interrupt_grace):
                self._kill()
                self._stopped = "an earlier cell ignored the interrupt after its timeout; the grader killed the kernel"
        return cell, resources

    def _stop(self, reason):
        self._stopped = reason
        self._kill()

    def _kill(self):
        try:
            run_sync(self.km.shutdown_kernel)(now=True)
        except Exception as error:  # already dead: nothing to kill
            self.log.warning("Killing the kernel: %s", error)

    async def _responds(self, grace):
        """Does the kernel answer a kernel_info request on the shell channel within `grace` seconds?"""
        msg_id = self.kc.kernel_info()  # queued behind the interrupted cell when that cell is still running
        deadline = monotonic() + grace
        while (left := deadline - monotonic()) > 0:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=left))
            except Empty:
                return False
            if msg["parent_header"].get("msg_id") == msg_id:
                return True
        return False

    def _error(self, ename, evalue):
        self.log.warning("%s: %s", ename, evalue)
        return new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])

    def output(self, outs, msg, display_id, cell_index):
        """Keep at most max_output_chars characters of output per cell, as the messages arrive."""
        content = msg.get("content", {})
        if msg.get("msg_type") == "error":  # what decides the score: keep it, trimmed
            content["evalue"] = str(content.get("evalue", ""))[: self.max_output_chars]
            content["traceback"] = [str(line)[: self.max_output_chars] for line in content.get("traceback", [])][:200]
            return super().output(outs, msg, display_id, cell_index)
        used = self._output_chars.get(cell_index, 0)
        left = self.max_output_chars - used
        kept = None
        if msg.get("msg_type") == "stream":
            text = str(content.get("text", ""))
            if len(text) <= left:
                self._output_chars[cell_index] = used + len(text)
                return super().output(outs, msg, display_id, cell_index)
            if left > 0:  # keep the beginning of the text that crosses the limit
                content["text"] = text[:left]
                kept = super().output(outs, msg, display_id, cell_index)
        else:
            size = len(json.dumps(content.get("data", {})))
            if size <= left:
                self._output_chars[cell_index] = used + size
                return super().output(outs, msg, display_id, cell_index)
        if used <= self.max_output_chars:  # say it once, on stdout (nbgrader scores stderr as a failure)
            outs.append(new_output("stream", name="stdout", text=(
                f"\n[output truncated by the grader: more than {self.max_output_chars} characters]\n")))
            self._output_chars[cell_index] = self.max_output_chars + 1
        return kept


class RestoringOverwriteCells(OverwriteCells):
    """nbgrader's OverwriteCells that trusts nothing in the submission's nbgrader metadata except grade_id.

    In nbgrader 0.9.6, add_missing_cells crashes when a deleted test cell followed a locked non-graded cell, or
    when a cell carries an unknown grade_id; and a solution cell relabelled `grade: true` breaks the autograde.
    Here a cell's kind and points come from the gradebook, a cell whose grade_id the gradebook does not know
    becomes a plain cell (its code still runs as the student's), and every missing graded cell is put back after
    the nearest cell that precedes it in the instructor's notebook.
    """

    add_missing_cells = True

    def preprocess_cell(self, cell, resources, index):
        meta = cell.metadata.get("nbgrader")
        if meta is None:
            return cell, resources
        grade_id = meta.get("grade_id")
        if grade_id is None:  # emptied by DeduplicateIds, or hand-made: nbgrader's later steps expect a grade_id
            del cell.metadata["nbgrader"]
            return cell, resources
        try:
            self.gradebook.find_source_cell(grade_id, self.notebook_id, self.assignment_id)
        except MissingEntry:
            self.log.warning("Cell %r is not in the gradebook: graded as a plain cell", grade_id)
            del cell.metadata["nbgrader"]
            return cell, resources
        for kind, finder in (("grade", self.gradebook.find_graded_cell),
                             ("solution", self.gradebook.find_solution_cell)):
            try:
                found = finder(grade_id, self.notebook_id, self.assignment_id)
            except MissingEntry:
                found = None
            if bool(meta.get(kind)) != (found is not None):
                self.report_change(grade_id, kind, found is not None, meta.get(kind))
            meta[kind] = found is not None
            if kind == "grade":
                if found is None:
                    meta.pop("points", None)
                else:
                    meta["points"] = float(found.max_score)
        return super().preprocess_cell(cell, resources, index)

    def add_missing_grade_cells(self, nb, resources):
        source_nb = self.gradebook.find_notebook(self.notebook_id, self.assignment_id)
        source_cells = {cell.name: cell for cell in source_nb.source_cells}
        graded = {cell.name: cell for cell in source_nb.grade_cells}
        solutions = {cell.name for cell in source_nb.solution_cells}
        order = self._instructor_order(resources) or list(source_cells)
        for position, grade_id in enumerate(order):
            present = {cell.metadata.get("nbgrader", {}).get("grade_id"): i for i, cell in enumerate(nb.cells)}
            if grade_id not in graded or grade_id in present:
                continue
            self.log.warning("Graded cell %r is missing: put back from the gradebook", grade_id)
            before = next((present[g] for g in reversed(order[:position]) if g in present), -1)
            restored = self.missing_cell_transform(source_cells[grade_id], graded[grade_id].max_score,
                                                   is_solution=grade_id in solutions)
            taken = {cell.get("id") for cell in nb.cells}
            restored["id"] = next(i for i in (f"restored-{grade_id}"[:60] + (f"-{n}" if n else "") for n in range(99))
                                  if i not in taken)  # nbformat 4.5 wants a unique id
            nb.cells.insert(before + 1, restored)
        return nb, resources

    def _instructor_order(self, resources):
        """grade_ids in the order of the instructor's source notebook (the gradebook keeps no cell order)."""
        coursedir = getattr(getattr(self.parent, "parent", None), "coursedir", None)
        if coursedir is None:
            return None
        path = os.path.join(coursedir.format_path(coursedir.source_directory, ".", self.assignment_id),
                            f"{self.notebook_id}.ipynb")
        try:
            with open(path, encoding="utf-8") as f:
                cells = json.load(f)["cells"]
        except (OSError, ValueError, KeyError):
            return None
        return [cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") for cell in cells]


class ErrorsFailTests(NbGraderPreprocessor):
    """A test cell with an error (or stderr) scores 0, whatever it displayed first.

    nbgrader reads a test cell's outputs in order and takes the first execute_result as partial credit (a
    non-number counts as full marks), so student code that calls sys.displayhook before a failing assert would
    score. Here execute_results of failing test cells become display_data, and the error decides.
    """

    def preprocess_cell(self, cell, resources, index):
        if nbgrader_utils.is_grade(cell) and not nbgrader_utils.is_solution(cell) and cell.cell_type == "code":
            failed = any(o.output_type == "error" or (o.output_type == "stream" and o.get("name") == "stderr")
                         for o in cell.outputs)
            if failed:
                for output in cell.outputs:
                    if output.output_type == "execute_result":
                        output.output_type = "display_data"
                        output.pop("execution_count", None)
        return cell, resources


class FlagForReview(NbGraderPreprocessor):
    """Flag a submission for manual review when student-written cells reach into IPython or the interpreter.

    Such code can rewrite the tests before they run (input transformers), run code around every cell (events),
    or hide failures; inside the kernel nothing stops it. The scores stay as computed; every grade of the
    notebook is marked "needs manual grade" (the formgrader lists them) and the reasons go to the log and to the
    autograded notebook's metadata.
    """

    patterns = List(Unicode(), [
        r"input_transformers|ast_transformers|\bevents\s*\.\s*register",  # rewrite or wrap every cell
        r"InteractiveShell|showtraceback|displayhook|excepthook|get_ipython",  # the shell's reporting
        r"\bsys\s*\.\s*(settrace|setprofile|modules)\b|__builtins__|\bimport\s+builtins\b",  # the interpreter
        r"\bos\s*\.\s*(_exit|kill|killpg)\b|\bsignal\s*\.\s*signal\b",  # leaving, or ignoring interrupts
    ], help="Regular expressions; a match in a cell the student could edit flags the notebook.").tag(config=True)

    def preprocess(self, nb, resources):
        reasons = []
        for cell in nb.cells:
            if cell.cell_type != "code" or nbgrader_utils.is_locked(cell):
                continue
            for pattern in self.patterns:
                found = re.search(pattern, cell.source)
                if found:
                    where = cell.metadata.get("nbgrader", {}).get("grade_id") or cell.get("id") or "a student cell"
                    reasons.append(f"{where}: {found.group(0)}")
        if reasons:
            info = resources["nbgrader"]
            self.log.warning("Flagged for review (%s, %s): %s", info["assignment"], info["student"],
                             "; ".join(reasons))
            nb.metadata["grader_review"] = reasons
            with Gradebook(info["db_url"]) as gb:
                submission = gb.find_submission_notebook(info["notebook"], info["assignment"], info["student"])
                for grade in submission.grades:
                    grade.needs_manual_grade = True
                gb.db.commit()
        return nb, resources


def _swap(preprocessors, old, new):
    return [new if p is old else p for p in preprocessors]


def _insert_around(preprocessors, anchor, before=(), after=()):
    i = preprocessors.index(anchor)
    return [*preprocessors[:i], *before, anchor, *after, *preprocessors[i + 1:]]


# === Course directory (shared by all assignments) ================================================================
c.CourseDirectory.root = os.path.join(REPO, "labs")
c.CourseDirectory.source_directory = "source"  # labs/source/<assignment>/<assignment>.ipynb
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.submitted_directory = "submitted"  # labs/submitted/<student>/<assignment>/
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
# the gradebook is sqlite:///<root>/gradebook.db unless CourseDirectory.db_url says otherwise (docs/jupyterhub.md)

# === generate_assignment: what the students' copy loses (nbgrader's defaults, spelled out) =======================
c.ClearSolutions.begin_solution_delimeter = "BEGIN SOLUTION"  # ### BEGIN SOLUTION ... ### END SOLUTION
c.ClearSolutions.end_solution_delimeter = "END SOLUTION"
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearHiddenTests.begin_test_delimeter = "BEGIN HIDDEN TESTS"  # removed from the release, run at autograde
c.ClearHiddenTests.end_test_delimeter = "END HIDDEN TESTS"

# === autograde ===================================================================================================
# time: each cell gets 30 s, then the kernel is interrupted and that cell fails; a kernel still busy 5 s after
# the interrupt is killed and the remaining cells fail; a notebook gets 10 minutes in all
c.Execute.timeout = 30
c.Execute.interrupt_on_timeout = True
c.ExecutePreprocessor.timeout = 30
c.GuardedExecute.interrupt_grace = 5
c.GuardedExecute.notebook_timeout = 600
# output: 100 000 characters per cell as it arrives, then nbgrader's own limits of 1000 lines per cell and 100
# traceback lines per error
c.GuardedExecute.max_output_chars = 100_000
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100
# the order of nbgrader 0.9's default lists, with the preprocessors above swapped in or added
c.Autograde.sanitize_preprocessors = _swap(
    Autograde.class_traits()["sanitize_preprocessors"].default(), OverwriteCells, RestoringOverwriteCells)
c.Autograde.autograde_preprocessors = _insert_around(
    _swap(Autograde.class_traits()["autograde_preprocessors"].default(), Execute, GuardedExecute),
    SaveAutoGrades, before=[ErrorsFailTests], after=[FlagForReview])
c.Autograde.create_student = True  # a student missing from the gradebook is added

# === Labs (labs/source/lab*) =====================================================================================
# Nothing lab-specific is needed: each lab imports minialloc, which must be installed in the grading kernel's
# environment (pip install -e . in the repository).

# === Graded quizzes ==============================================================================================
# quizzes/graded/ is a course of its own with its own nbgrader_config.py (run nbgrader from there).
