"""nbgrader preprocessors that run in the grader's process: autograde's execution and scoring, and feedback.

Installed by the repository's nbgrader_config.py (labs) and quizzes/graded/nbgrader_config.py (the graded quiz);
tests/test_nbgrader_hostile.py grades hostile submissions through them. Each class says what it defends against;
docs/grading.md lists them all with what they do not defend.

Autograde, in order: RestoringOverwriteCells (sanitize: test cells back from the gradebook),
StripExecutionControl (no tag or kernelspec of the submission steers the execution), GuardedExecute (the
sandboxed kernel, per-cell timeouts, dead kernels, capped output; a test cell that did not run fails),
InertOutputs (no active content in any output or markdown cell), LimitOutput, QuizGrade (the graded quiz only:
scores computed here from the submission's plain answers), ErrorsFailTests, SaveAutoGrades, FlagForReview.
Feedback: RedactHiddenTests (no output quotes a hidden test), HideTestTracebacks (test cells show pass/fail and
the grader's message only), KernelOutputsWithheld (no other output of the kernel's), InertOutputs again,
ScanForKeys (no private-key material). Before any of it, the submission folder is checked (grading/intake.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from queue import Empty
from time import monotonic

from jupyter_core.utils import ensure_async, run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbconvert.preprocessors import Preprocessor
from nbformat.notebooknode import NotebookNode
from nbformat.v4 import new_output
from nbgrader import utils as nbgrader_utils
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import Execute, NbGraderPreprocessor, OverwriteCells
from traitlets import Bool, Integer, List, Unicode

from .labspecs.probe_common import KNOWN_NAMES
from .sandbox import SandboxKernelManager


def is_test_cell(cell: NotebookNode) -> bool:
    """An autograder test cell: graded code that is not the student's answer."""
    return (cell.get("cell_type") == "code" and nbgrader_utils.is_grade(cell)
            and not nbgrader_utils.is_solution(cell))


def cell_name(cell: NotebookNode, default: str = "a cell") -> str:
    """How the log and the notebook's grader_* metadata name a cell: its grade_id, else its id."""
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or cell.get("id") or default


class GuardedExecute(Execute):
    """nbgrader's Execute, with the kernel's death, an ignored interrupt and floods of output handled per cell.

    nbgrader 0.9.6 aborts a student's autograde when the kernel dies (no autograded notebook, no feedback) and
    when a timed-out cell ignores SIGINT (nbclient then raises "Timeout waiting for IOPub output"); a cell that
    ignores SIGINT would otherwise make every later cell wait out its own timeout as well. Here the cell that
    killed or hung the kernel gets an error, every later code cell gets a "not run" error (so its tests score 0),
    and the cells before keep their results. A kernel that dies before its first cell is started again.

    The kernel runs in the sandbox of grading.sandbox (unless `sandbox` is False). A test cell whose
    execution the grader did not see complete (skipped, never reached, its reply lost) fails with "NotRun": nbgrader
    alone gives full points to a test cell without output. A cell whose output message was larger than the
    sandbox's message cap loses its output (ZeroMQ drops the connection before the grader allocates the message):
    the grader reconnects, and the cell fails with "OutputTooLarge".

    Every message the kernel sends for a cell counts (nbclient's own handling bypasses an output cap for some):
    at most max_messages_per_cell messages per cell are handled (status messages aside), and the characters
    they add to the notebook count against max_output_chars per cell and max_notebook_output_chars per notebook:
    streams, display data and results (data and metadata), errors, widget state from comm messages, and the
    fan-out of a display update. nbclient applies an update_display_data (or a display with a display_id seen
    before) to every output carrying that id, anywhere in the notebook, without calling output(): 2000 small
    displays under one id and one 90 KB update make 180 MB of notebook. Here the update costs its size times the
    number of outputs it would rewrite, and is dropped when that is over what is left.
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

    max_notebook_output_chars = Integer(
        2_000_000, help="Characters of output kept for the whole notebook, every cell's together."
    ).tag(config=True)
    max_messages_per_cell = Integer(
        10_000, help="Messages handled per cell (status aside); later ones are dropped (0: no limit)."
    ).tag(config=True)

    start_retries = Integer(
        2, help="Kernel starts to retry when a kernel dies before running any cell (a port taken meanwhile)."
    ).tag(config=True)
    sandbox = Bool(
        True, help="Run the kernel in the bubblewrap sandbox (grading.sandbox); False runs it unconfined."
    ).tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.sandbox:  # nbgrader's Execute sets its own kernel manager class in __init__: replace it after
            self.kernel_manager_class = SandboxKernelManager

    def on_cell_executed(self, **kwargs):
        self._replied.add(kwargs["cell_index"])
        return super().on_cell_executed(**kwargs)

    def preprocess(self, nb, resources=None, km=None):
        for attempt in range(self.start_retries + 1):
            self._stopped = None  # why the remaining cells cannot run, once the kernel is gone
            self._deadline = monotonic() + self.notebook_timeout if self.notebook_timeout else None
            self._output_chars = {}  # cell index -> characters kept so far
            self._notebook_chars = 0  # all cells together
            self._messages: dict[int, int] = {}  # cell index -> messages handled
            self._noted: set[int] = set()  # cells told that output was dropped
            self._started = False  # whether a cell was sent to the kernel: no retry after that
            self._replied: set[int] = set()  # cells whose execute_reply arrived
            try:
                nb, resources = super().preprocess(nb, resources, km)
            except Exception as error:  # the kernel did not start (a port taken meanwhile, a slow machine)
                if self._started or attempt == self.start_retries:
                    raise
                self.log.warning("The kernel did not start (%s); starting another", error)
                self.km = self.kc = None
                continue
            for index, cell in enumerate(nb.cells):
                if is_test_cell(cell) and index not in self._replied and not _errors(cell):
                    cell.outputs.append(self._error("NotRun", "this test cell was not executed"))
            return nb, resources

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
        except CellTimeoutError:
            # nbclient raises this when the end of a cell's output never arrives. Either the kernel is still busy
            # (an interrupt it ignored), or it finished and ZeroMQ dropped an oversized message: then it answers.
            if run_sync(self._responds)(self.interrupt_grace):
                cell.outputs.append(self._error("OutputTooLarge", (
                    "the cell's output came in a message larger than the grader accepts; it was dropped")))
                if not run_sync(self._reconnect_iopub)():
                    self._stop("the grader could not reconnect to the kernel after a dropped message")
                return cell, resources
            # the interrupted kernel kept running and sending nothing: the interrupt was ignored
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

    async def _reconnect_iopub(self, tries: int = 10) -> bool:
        """A new IOPub connection (ZeroMQ closed the old one on the oversized message), checked to be receiving."""
        self.kc.iopub_channel.stop()
        self.kc._iopub_channel = None  # the property makes a new channel, with a new socket and subscription
        self.kc.iopub_channel.start()
        for _ in range(tries):  # a new subscriber misses what is sent before its subscription arrives
            msg_id = self.kc.kernel_info()
            deadline = monotonic() + 1
            while (left := deadline - monotonic()) > 0:
                try:
                    msg = await ensure_async(self.kc.iopub_channel.get_msg(timeout=left))
                except (Empty, asyncio.TimeoutError):
                    break
                if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" and \
                        msg["content"].get("execution_state") == "idle":
                    await self._drain_shell(msg_id)
                    return True
        return False

    async def _drain_shell(self, msg_id: str) -> None:
        while True:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=1))
            except (Empty, asyncio.TimeoutError):
                return
            if msg["parent_header"].get("msg_id") == msg_id:
                return

    def _error(self, ename, evalue):
        self.log.warning("%s: %s", ename, evalue)
        return new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])

    def _left(self, cell_index: int) -> int:
        cell_left = self.max_output_chars - self._output_chars.get(cell_index, 0)
        return max(0, min(cell_left, self.max_notebook_output_chars - self._notebook_chars))

    def _charge(self, cell_index: int, cost: int) -> bool:
        """Count `cost` characters against the cell's and the notebook's caps; False (nothing counted) if over."""
        if cost > self._left(cell_index):
            return False
        self._output_chars[cell_index] = self._output_chars.get(cell_index, 0) + cost
        self._notebook_chars += cost
        return True

    def _truncated(self, outs, cell_index: int) -> None:
        """Say once per cell, on stdout (nbgrader scores stderr as a failure), that output was dropped."""
        if cell_index not in self._noted:
            self._noted.add(cell_index)
            outs.append(new_output("stream", name="stdout", text=(
                f"\n[output truncated by the grader: more than {self.max_output_chars} characters in this cell, "
                f"{self.max_notebook_output_chars} in the notebook, or {self.max_messages_per_cell} messages]\n")))

    def process_message(self, msg, cell, cell_index):
        msg_type = msg.get("msg_type")
        if msg_type in ("status", "execute_input"):  # the end of a cell, and its echo: never dropped
            return super().process_message(msg, cell, cell_index)
        handled = self._messages[cell_index] = self._messages.get(cell_index, 0) + 1
        if self.max_messages_per_cell and handled > self.max_messages_per_cell:
            self._truncated(cell.outputs, cell_index)
            return None
        content = msg.get("content") or {}
        transient = content.get("transient") or {}
        display_id = transient.get("display_id") if isinstance(transient, dict) else None
        if display_id and msg_type in ("execute_result", "display_data", "update_display_data"):
            rewritten = sum(len(places) for places in self._display_id_map.get(display_id, {}).values())
            if rewritten and not self._charge(cell_index, rewritten * _size(content)):
                self._truncated(cell.outputs, cell_index)
                return None
        elif msg_type and msg_type.startswith("comm") and not self._charge(cell_index, _size(content)):
            return None  # widget state, kept in the notebook's metadata
        return super().process_message(msg, cell, cell_index)

    def output(self, outs, msg, display_id, cell_index):
        """Keep output within the cell's and the notebook's caps, as the messages arrive."""
        content = msg.get("content", {})
        if msg.get("msg_type") == "error":  # what decides the score: a cell's first error is kept, trimmed
            content["ename"] = str(content.get("ename", ""))[:200]
            content["evalue"] = str(content.get("evalue", ""))[:2000]
            lines, room = [], min(self.max_output_chars, self._left(cell_index))
            for line in content.get("traceback", [])[:200]:
                line = str(line)[:room]
                room -= len(line)
                lines.append(line)
                if room <= 0:
                    break
            content["traceback"] = lines
            cost = len(json.dumps([content["ename"], content["evalue"], lines]))
            if any(o.get("output_type") == "error" for o in outs) and not self._charge(cell_index, cost):
                self._truncated(outs, cell_index)
                return None
            self._output_chars[cell_index] = self._output_chars.get(cell_index, 0) + cost
            self._notebook_chars += cost
            return super().output(outs, msg, display_id, cell_index)
        kept = None
        if msg.get("msg_type") == "stream":
            text = str(content.get("text", ""))
            left = self._left(cell_index)
            if self._charge(cell_index, len(text)):
                return super().output(outs, msg, display_id, cell_index)
            if left > 0:  # keep the beginning of the text that crosses the limit
                content["text"] = text[:left]
                self._charge(cell_index, left)
                kept = super().output(outs, msg, display_id, cell_index)
        elif self._charge(cell_index, _size(content)):
            return super().output(outs, msg, display_id, cell_index)
        self._truncated(outs, cell_index)
        return kept


def _size(content) -> int:
    """Characters an output adds to the notebook: its data and metadata as JSON (what nbformat writes)."""
    try:
        return len(json.dumps({"data": content.get("data"), "metadata": content.get("metadata")}))
    except (TypeError, ValueError):
        return len(str(content))


def _errors(cell: NotebookNode) -> list[NotebookNode]:
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


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
        if is_test_cell(cell):
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
    or hide failures; inside the kernel nothing stops it. LabGrade adds its own reasons (answers that look delegated
    to or copied from minialloc) through resources["grader_review"]. The scores stay as computed; every grade of the
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
        reasons = list(resources.get("grader_review", []))  # LabGrade's: answers that look delegated or copied
        for cell in nb.cells:
            if cell.cell_type != "code" or nbgrader_utils.is_locked(cell):
                continue
            for pattern in self.patterns:
                found = re.search(pattern, cell.source)
                if found:
                    where = cell_name(cell, "a student cell")
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


class StripExecutionControl(NbGraderPreprocessor):
    """Remove everything in a submission that steers how it is executed, before autograde executes it.

    nbclient skips a cell tagged `skip-execution` (its tag name is configurable, ExecutePreprocessor's
    skip_cells_with_tag) and lets a cell tagged `raises-exception` fail without stopping; nbgrader then gives a
    test cell that never ran full points. No tag has a say in grading, so every cell loses all its tags, whatever
    their names (a tag some future nbclient honours included). The notebook's kernelspec and language_info are
    replaced by the grader's (the sandboxed kernel ignores them anyway). The names removed go to the log and to
    the notebook's metadata (`grader_stripped`), for the instructor to see.
    """

    def preprocess(self, nb, resources):
        stripped = []
        for cell in nb.cells:
            tags = cell.get("metadata", {}).pop("tags", None)
            if tags:
                where = cell_name(cell)
                stripped.append(f"{where}: tags {list(tags)!r}")
        kernelspec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
        if nb.metadata.get("kernelspec") != kernelspec:
            if nb.metadata.get("kernelspec") not in (None, {}):
                stripped.append(f"kernelspec {dict(nb.metadata.get('kernelspec'))!r}")
            nb.metadata["kernelspec"] = kernelspec
        if stripped:
            self.log.warning("Execution control removed before autograde: %s", "; ".join(stripped))
            nb.metadata["grader_stripped"] = stripped
        return nb, resources


class QuizGrade(NbGraderPreprocessor):
    """Score the graded quiz in the grader's process, from the plain answers written in the notebook's source.

    Runs after the execution: whatever the kernel did, the slot cells' outputs are replaced by the grader's verdict
    from quizzes.graded.scoring.grade_notebook (the instructor's private bank and course secret, the student id
    nbgrader gives, never what the notebook says), in the form nbgrader's SaveAutoGrades reads: no error for full
    points, an error for none, the number as an execute_result for partial credit. The feedback line says what
    was right, never the answer. The bank and the secret are read here, outside the sandbox, and never reach it.
    """

    bank_dir = Unicode("", help="The instructor's private bank folder (or env MINIALLOC_PRIVATE_BANK).").tag(
        config=True)
    secret_file = Unicode("", help="The course secret file (default: course.secret in the bank folder).").tag(
        config=True)

    def preprocess(self, nb, resources):
        from quizzes.graded.scoring import grade_notebook
        from quizzes.graded.secret import default_secret_path, load_secret

        bank = self.bank_dir or os.environ.get("MINIALLOC_PRIVATE_BANK", "")
        if not bank:
            raise ValueError("QuizGrade needs the private bank: --QuizGrade.bank_dir=DIR (or MINIALLOC_PRIVATE_BANK)")
        secret = load_secret(Path(self.secret_file) if self.secret_file else default_secret_path(Path(bank)))
        info = resources["nbgrader"]
        scores = grade_notebook(nb, info["student"], Path(bank), secret, quiz=info["assignment"])
        cells = {cell.metadata.get("nbgrader", {}).get("grade_id"): cell for cell in nb.cells if is_test_cell(cell)}
        for score in scores:
            cell = cells.get(score.key)
            if cell is None:
                raise ValueError(f"the quiz notebook has no test cell {score.key!r} for its scores")
            if abs(float(cell.metadata["nbgrader"]["points"]) - score.max_points) > 1e-9:
                raise ValueError(f"{score.key}: the gradebook says {cell.metadata['nbgrader']['points']} points, "
                                 f"the quiz {score.max_points}")
            outputs = [new_output("stream", name="stdout", text=f"{score.feedback}\n")]
            if score.points <= 0:
                outputs.append(new_output("error", ename="Wrong", evalue=score.feedback,
                                          traceback=[f"Wrong: {score.feedback}"]))
            elif score.points < score.max_points:
                outputs.append(new_output("execute_result", data={"text/plain": repr(float(score.points))},
                                          execution_count=cell.get("execution_count")))
            cell.outputs = outputs
        graded = {score.key for score in scores}
        for grade_id, cell in cells.items():  # a graded cell the scores do not cover earns nothing
            if grade_id not in graded:
                cell.outputs = [new_output("error", ename="NotGraded", evalue="not one of this quiz's slots",
                                           traceback=["NotGraded: not one of this quiz's slots"])]
        return nb, resources


class HideTestTracebacks(Preprocessor):
    """Feedback: a test cell shows whether it failed, with its exception's name and message; nothing else.

    nbgrader makes feedback from the autograded notebook, where the hidden tests are back in the test cells.
    ClearHiddenTests removes them from the cells' source, but a failed hidden assert still prints its own line in
    the traceback (`----> 4 assert best_fit(...) == 3`): the hidden test itself. And whatever a test cell printed
    or displayed was printed by code the student controls (a student function the test calls can print the
    calling cell's source, from linecache). So a test cell keeps only its errors, each as one line "Name:
    message"; its stream and display outputs are dropped (a note says so). Visible checks keep their hints (their
    messages). `keep_test_output` keeps the other outputs: the graded quiz sets it, where QuizGrade writes every
    output of the test cells in the grader's process.
    """

    enabled = Bool(True)  # nbconvert preprocessors are off unless enabled; listing one in the config means "on"
    keep_test_output = Bool(
        False, help="Keep the stream and display outputs of test cells (only when the grader wrote them all)."
    ).tag(config=True)

    def preprocess(self, nb, resources):
        from .labspecs import spec_for

        assignment = (resources or {}).get("nbgrader", {}).get("assignment", "")
        # LabGrade (a scored lab) and QuizGrade (keep_test_output) wrote every test cell's outputs themselves
        self._grader_wrote = self.keep_test_output or (bool(assignment) and spec_for(assignment) is not None)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        if is_test_cell(cell):
            kept, dropped = [], 0
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    if getattr(self, "_grader_wrote", False):
                        ename, message = output.get("ename", "Error"), output.get("evalue") or "a test failed"
                    else:  # the kernel's: its message can be the student's (an answer raising with any text)
                        name = output.get("ename")
                        ename = name if type(name) is str and name in KNOWN_NAMES else "Error"
                        message = "this test failed"
                        output["ename"], output["evalue"] = ename, message
                    output["traceback"] = [f"{ename}: {message}"]
                    kept.append(output)
                elif self.keep_test_output:
                    kept.append(output)
                else:
                    dropped += 1
            if dropped:
                kept.insert(0, new_output("stream", name="stdout", text=(
                    "[the grader does not show what a test cell printed or displayed]\n")))
            cell.outputs = kept
        return cell, resources


class KernelOutputsWithheld(Preprocessor):
    """Feedback: no output the student's kernel made leaves in it, only the grader's words.

    The kernel ran the hidden tests, so any output of any cell can carry them, in any encoding (a cell of the
    student's that prints them base64-encoded, reversed or compressed, a thread that prints later, an answer that
    raises with them as its message): no pattern recognises every encoding. So the feedback keeps the source of
    the student's own cells, and of the test cells only what HideTestTracebacks keeps (the grader's verdicts);
    every other output is replaced by one note per cell. The student's outputs are in their own notebook; the
    instructor sees everything in the autograded notebook. A test cell's outputs are HideTestTracebacks' to trim.
    """

    enabled = Bool(True)
    note = "[the grader does not show in feedback what the notebook printed or displayed]\n"

    def preprocess_cell(self, cell, resources, index):
        if cell.get("cell_type") == "code" and not is_test_cell(cell) and cell.get("outputs"):
            cell.outputs = [new_output("stream", name="stdout", text=self.note)]
        return cell, resources


class RedactHiddenTests(Preprocessor):
    """Feedback, before ClearHiddenTests: no output of any cell quotes a hidden test's line.

    HideTestTracebacks drops what test cells print; a student's own cell that runs later can still print what the
    kernel saw of a hidden test (its source stays in the kernel's linecache). Every output whose text holds a
    line of a hidden test (16 characters or more, found nowhere else in the notebook) is replaced by a note, and
    the cells are listed in the notebook's metadata (`grader_redacted_tests`). A second line: a line the student's
    code transformed (reversed, encoded) is not recognised.
    """

    enabled = Bool(True)
    begin = Unicode("BEGIN HIDDEN TESTS").tag(config=True)
    end = Unicode("END HIDDEN TESTS").tag(config=True)
    min_chars = Integer(16, help="Shorter hidden-test lines are not looked for (too common).").tag(config=True)

    def preprocess(self, nb, resources):
        region = re.compile(rf"^[^\n]*{re.escape(self.begin)}[^\n]*$(.*?)^[^\n]*{re.escape(self.end)}[^\n]*$",
                            re.M | re.S)
        hidden, visible = set(), []
        for cell in nb.cells:
            source = "".join(cell.source) if isinstance(cell.source, list) else cell.source
            if is_test_cell(cell):
                hidden.update(line.strip() for block in region.findall(source) for line in block.splitlines())
            visible.append(region.sub("", source))
        elsewhere = "\n".join(visible)
        needles = [line for line in hidden if len(line) >= self.min_chars and line not in elsewhere]
        if not needles:
            return nb, resources
        squeezed = [_squeeze(n) for n in needles]
        redacted = []
        for cell in nb.cells:
            kept = []
            for output in cell.get("outputs", []):
                text = _output_text(output) + json.dumps(output)
                if any(n in text for n in needles) or any(q in _squeeze(text) for q in squeezed):
                    kept.append(new_output("stream", name="stdout", text=(
                        "[removed by the grader: this output quoted a hidden test]\n")))
                    redacted.append(cell_name(cell))
                else:
                    kept.append(output)
            if "outputs" in cell:
                cell.outputs = kept
        if redacted:
            self.log.warning("Hidden-test lines removed from feedback: %s", ", ".join(map(str, redacted)))
            nb.metadata["grader_redacted_tests"] = redacted
        return nb, resources


# What a graded notebook keeps of a rich output: plain text and raster images. Everything else the student's code
# can display (text/html, text/markdown, application/javascript, image/svg+xml, widget views, LaTeX, unknown types)
# can carry script into the formgrader's page or the feedback.
INERT_TYPES = ("text/plain", "image/png", "image/jpeg")
BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")


class InertOutputs(Preprocessor):
    """After execution, and again before feedback: no output of the student's carries active content.

    For every output of every cell: rich data keeps text/plain, and image/png and image/jpeg when they are plain
    base64 (they are written into an <img> tag's data URL); every other type is removed, and text/plain says which
    were (a text/plain is made when there was none). Output metadata is dropped (its width and height are written
    into the <img> tag), and so are markdown attachments other than PNG and JPEG, and the notebook's widget state.
    Streams and errors are text that nbconvert escapes. A markdown cell (a student's written answer, a cell they
    added or edited) whose rendering holds anything but formatting, http(s), mailto and in-page links and images
    (a script, an event handler, a javascript: link however its scheme is spelled, a relative link to a file, a
    comment) becomes a code block of its text, after a note, so the instructor sees what was written. This is a
    first line: the feedback and the formgrader render every markdown cell through the allow-list sanitizer of
    grading/sanitize.py whatever this decided. What was removed goes to the notebook's metadata
    (`grader_inert`). The instructor's own markdown cells (instructor_markdown) are left as written.
    """

    enabled = Bool(True)

    def preprocess(self, nb, resources):
        removed: list[str] = []
        for cell in nb.cells:
            where = cell_name(cell)
            for output in cell.get("outputs", []):
                if "data" in output:
                    gone = self._inert(output)
                    if gone:
                        removed.append(f"{where}: {', '.join(gone)}")
                if "metadata" in output:
                    output["metadata"] = {}
            attachments = cell.get("attachments")
            if attachments:
                for name in list(attachments):
                    bundle = attachments[name]
                    if not isinstance(bundle, dict) or not all(
                            k in ("image/png", "image/jpeg") and _base64(v) for k, v in bundle.items()):
                        del attachments[name]
                        removed.append(f"{where}: attachment {ascii(name)}")
        instructors = instructor_markdown(self, resources)
        for cell in nb.cells:
            if cell.get("cell_type") == "markdown" and _text(cell.get("source", "")) in instructors:
                continue  # the instructor's own text, as written in the course's source notebook
            if cell.get("cell_type") == "markdown" and (why := markdown_activity(cell.get("source", ""),
                                                                                 cell.get("attachments"))):
                where = cell_name(cell)
                cell.source = inert_markdown(cell.source, why)
                removed.append(f"{where}: markdown ({why})")
        if nb.metadata.pop("widgets", None) is not None:
            removed.append("the notebook's widget state")
        if removed:
            self.log.warning("Active content removed from the notebook: %s", "; ".join(removed[:20]))
            nb.metadata["grader_inert"] = removed
        return nb, resources

    @staticmethod
    def _inert(output) -> list[str]:
        data = output["data"]
        gone = sorted(k for k, v in data.items() if k not in INERT_TYPES or (k != "text/plain" and not _base64(v)))
        if gone:
            for key in gone:
                del data[key]
            plain = data.get("text/plain", "")
            plain = "".join(plain) if isinstance(plain, list) else str(plain)
            note = f"[the grader removed this output's {', '.join(ascii(k) for k in gone)}]"
            data["text/plain"] = f"{plain}\n{note}" if plain else note
        return gone


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else str(source)


def instructor_markdown(preprocessor, resources) -> set[str]:
    """The texts of the markdown cells of the instructor's source notebook of this assignment (empty when the
    course directory or the notebook cannot be found: then every markdown cell is checked as a student's).

    Only the student's cells are made inert: a cell whose text is exactly one of the instructor's (a locked cell
    restored from the gradebook, the lab's introduction, the quiz's prompts) renders as the instructor wrote it. A
    student who copies an instructor's cell unchanged gains nothing by it; a changed byte makes it theirs."""
    info = (resources or {}).get("nbgrader") or {}
    coursedir = getattr(getattr(getattr(preprocessor, "parent", None), "parent", None), "coursedir", None)
    if coursedir is None or not info.get("assignment") or not info.get("notebook"):
        return set()
    path = os.path.join(coursedir.format_path(coursedir.source_directory, ".", info["assignment"]),
                        f"{info['notebook']}.ipynb")
    try:
        with open(path, encoding="utf-8") as f:
            cells = json.load(f)["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return {_text(c.get("source", "")) for c in cells if isinstance(c, dict) and c.get("cell_type") == "markdown"}


# What a markdown cell may render to: formatting, links and images with ordinary URLs. Anything else (a script,
# a style, an SVG, a form, an event handler, a javascript: URL, a comment a browser may end elsewhere) makes the
# cell inert text. nbgrader's feedback and formgrade templates render markdown without nbconvert's sanitizer.
SAFE_TAGS = frozenset(
    "a abbr b blockquote br caption code col colgroup dd del details div dl dt em h1 h2 h3 h4 h5 h6 hr i img ins "
    "kbd li ol p pre q s samp small span strike strong sub summary sup table tbody td tfoot th thead tr tt u ul "
    "var".split())
SAFE_ATTRIBUTES = frozenset("alt align class colspan height href id rowspan src start title width".split())
# a link leads to http(s), mail or this page (#...): a relative link would open a file of the submission, which the
# formgrader serves from the course's origin; an image may also be relative (an image runs no script) or inline
SAFE_URL = {
    "href": re.compile(r"(https?:|mailto:|#)", re.I),
    "src": re.compile(r"(https?:|attachment:|data:image/(png|jpeg|gif);base64,|[#/?.]|[^:/?#]*([/?#]|$))", re.I),
}


class _MarkdownCheck(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.why: str | None = None

    def _flag(self, why: str) -> None:
        self.why = self.why or why

    def handle_starttag(self, tag, attrs):
        if tag not in SAFE_TAGS:
            self._flag(f"a {tag} tag")
        for name, value in attrs:
            if name not in SAFE_ATTRIBUTES:
                self._flag(f"attribute {name}")
            elif name in SAFE_URL:  # the value as a browser reads it: entities decoded (convert_charrefs)
                url = re.sub(r"[\x00-\x20\x7f]+", "", value or "")
                if not SAFE_URL[name].match(url):
                    self._flag(f"{name} URL")

    handle_startendtag = handle_starttag

    def handle_comment(self, data):
        self._flag("an HTML comment")

    def handle_decl(self, decl):
        self._flag("a declaration")

    def handle_pi(self, data):
        self._flag("a processing instruction")

    def unknown_decl(self, data):
        self._flag("a declaration")


# What markdown needs to render a tag, an entity (`javascript&colon;` decodes to a scheme), a URL scheme or a link
# target (`[x](notes.html)`, `[x][1]` with `[1]: ...`, `![i](...)`): a cell with none of them renders only
# formatting, so it is not rendered here (nbconvert took seconds to render 200 000 characters of `*a` here: autograde
# spends that time only on cells that could hold something active).
MARKDOWN_ACTIVE_MARKS = ("<", "&", ":", "](")


def markdown_activity(source, attachments=None) -> str | None:
    """Why a markdown cell's rendering is not inert (None when it is): nbconvert's own rendering, checked.

    The cell's `attachments` (a pasted image) are rendered with it, as nbconvert does for the feedback: without
    them nbconvert's renderer fails on `attachment:` links, which failed an honest student's autograde. A cell
    the renderer fails on is shown as text, never a failure of the student's autograde."""
    from .sanitize import render_uncleaned

    text = "".join(source) if isinstance(source, list) else str(source)
    if not any(mark in text for mark in MARKDOWN_ACTIVE_MARKS):
        return None  # no tag, entity, scheme or link target: markdown alone renders only formatting
    try:
        html = render_uncleaned(text, attachments)
    except Exception:  # mistune or nbconvert raised on the student's text: nothing of it is rendered
        return "markdown the grader could not render"
    check = _MarkdownCheck()
    check.feed(html)
    check.close()
    if check.rawdata.strip():
        check._flag("unparsed HTML")
    return check.why


def inert_markdown(source, why: str) -> str:
    """The cell's text as a code block (shown, never rendered as HTML), after a note of why."""
    text = "".join(source) if isinstance(source, list) else str(source)
    fence = "~" * max(3, 1 + max((len(m) for m in re.findall(r"~+", text)), default=0))
    why = re.sub(r"[^A-Za-z0-9 _.-]", "", why)  # a tag's name is the student's: nothing markdown or HTML reads
    return f"*[the grader shows this cell as text: it held {why}]*\n\n{fence}\n{text}\n{fence}\n"


def _base64(value) -> bool:
    text = "".join(value) if isinstance(value, list) else value
    return isinstance(text, str) and BASE64.fullmatch(text) is not None


PEM_PRIVATE = re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----")
# an Ed25519 private key as multibase base58btc (multicodec ed25519-priv 0x1300: "z3u2...")
MULTIBASE_PRIVATE = re.compile(r"z3u2[1-9A-HJ-NP-Za-km-z]{40,}")


def key_needles(path: Path) -> list[str]:
    """Strings whose presence in feedback means a key file's content leaked: its text, each base64 line of a PEM
    body, its bytes in hex and base64 (a raw key printed as bytes)."""
    try:
        data = path.read_bytes()
    except OSError:
        return []
    needles = [data.hex(), base64.b64encode(data).decode()]
    try:  # an unencrypted PEM key: its raw 32 bytes too, in hex and base64
        from cryptography.hazmat.primitives import serialization

        key = serialization.load_pem_private_key(data, password=None)
        raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
        needles += [raw.hex(), base64.b64encode(raw).decode().rstrip("=")]
    except (ValueError, TypeError, ImportError):  # not a key, an encrypted key, another key type
        pass
    text = data.decode("utf-8", "replace")
    needles += [line.strip() for line in text.splitlines() if len(line.strip()) >= 16 and "-----" not in line]
    return [n for n in needles if n]


class ScanForKeys(Preprocessor):
    """Before feedback is written: no private-key material leaves in it.

    Looks in every cell's source and outputs (stream text, rich data, error messages and tracebacks) for a PEM
    private key block, an Ed25519 private key in multibase form, and the content of the files listed in
    `key_files` (the issuer key, the course secret: their text, base64 lines, hex and base64 of their bytes).
    What matches is replaced, the cell is named in the log (an error: someone had the key in hand), and the
    notebook's metadata lists the cells (`grader_redacted`).
    """

    enabled = Bool(True)
    key_files = List(Unicode(), [], help="Files whose content must never appear in feedback.").tag(config=True)

    def preprocess(self, nb, resources):
        needles = [n for f in self.key_files for n in key_needles(Path(os.path.expanduser(f)))]
        redacted = []
        for cell in nb.cells:
            where = cell_name(cell)
            if self._leaks(cell.get("source", ""), needles):
                cell.source = "# [removed by the grader: this cell contained private-key material]"
                redacted.append(f"{where}: source")
            kept = []
            for output in cell.get("outputs", []):
                if self._leaks(json.dumps(output), needles) or self._leaks(_output_text(output), needles):
                    kept.append(new_output("stream", name="stdout", text=(
                        "[removed by the grader: this output contained private-key material]\n")))
                    redacted.append(f"{where}: output")
                else:
                    kept.append(output)
            if "outputs" in cell:
                cell.outputs = kept
        if redacted:
            self.log.error("Private-key material removed from feedback: %s", "; ".join(redacted))
            nb.metadata["grader_redacted"] = redacted
        return nb, resources

    @staticmethod
    def _leaks(text: str, needles: list[str]) -> bool:
        if PEM_PRIVATE.search(text) or MULTIBASE_PRIVATE.search(text):
            return True
        # a key printed across lines, in quoted pieces or in a repr with escapes still counts (base64 and hex have
        # no quotes, backslashes or spaces of their own)
        squeezed = _squeeze(text)
        return any(n in text or _squeeze(n) in squeezed for n in needles)


def _squeeze(text: str) -> str:
    return re.sub(r"""[\s'"\\]+""", "", text.replace("\\n", ""))


def _output_text(output: NotebookNode) -> str:
    parts = [output.get("text", ""), output.get("evalue", ""), *output.get("traceback", [])]
    parts += [v if isinstance(v, str) else "".join(v) if isinstance(v, list) else "" for v in
              output.get("data", {}).values()]
    return "\n".join(str(p) for p in parts)


def swap(preprocessors, old, new):
    """`preprocessors` with `old` replaced by `new`."""
    return [new if p is old else p for p in preprocessors]


def insert_around(preprocessors, anchor, before=(), after=()):
    """`preprocessors` with `before` and `after` put around `anchor`."""
    i = preprocessors.index(anchor)
    return [*preprocessors[:i], *before, anchor, *after, *preprocessors[i + 1:]]


