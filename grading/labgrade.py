"""LabGrade: a lab's graded test cells scored in the grader's process, from data, like the graded quiz.

Autograde still runs the whole notebook in the student's sandboxed kernel: its test cells are the student's
feedback. Then, for a lab listed in grading/labspecs, this preprocessor
1. takes the program: the lab's locked cells as the gradebook holds them (never the submission's copy) and the
   student's answer cells, in the notebook's order; the student's other cells are not part of it;
2. runs it in a fresh sandboxed process (grading/labrun.py) where, at each graded test cell, a probe calls
   the student's functions and classes on inputs chosen now (random seeds drawn at grading time, the boundary
   sizes) and returns plain data; minialloc's implementation is withheld in that process;
3. compares the data with references computed here with minialloc, and replaces each graded test cell's outputs
   with the verdict, in the form SaveAutoGrades reads (all or nothing per cell);
4. looks at the answer cells for copied or delegated work (grading/copied.py: minialloc, the public solutions and
   every other submission of the batch): the reasons go to `resources["grader_review"]`, which FlagForReview
   turns into "needs manual grade", and the copies' evidence (both passages) to the notebook's metadata
   (`grader_copies`); and flags each test whose verdict in the student's kernel and in the grader differ.
Nothing the notebook did in its own kernel reaches a score.
"""

from __future__ import annotations

import glob
import os
import random
import secrets
from pathlib import Path

from IPython.core.inputtransformer2 import TransformerManager
from nbformat.v4 import new_output
from nbgrader import utils as nbgrader_utils
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Integer

from . import labspecs
from .copied import read_answers, review
from .labrun import Step, run_steps
from .labspecs.probe_common import known_name

DELEGATION = ("your code runs minialloc's own implementation, which is withheld when labs are graded: write it")


class LabGrade(NbGraderPreprocessor):
    """Score a lab's graded test cells from the data its answers return in a fresh sandbox (see the module)."""

    enabled = Bool(True)
    cell_timeout = Integer(0, help="Seconds per cell and probe (0: Execute.timeout).").tag(config=True)
    grace = Integer(0, help="Seconds an interrupted cell has before the program is ended (0: "
                            "GuardedExecute.interrupt_grace).").tag(config=True)
    total_timeout = Integer(600, help="Seconds for the whole program.").tag(config=True)
    memory_bytes = Integer(3 * 1024**3, help="RLIMIT_AS of the grading process.").tag(config=True)

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        spec = labspecs.spec_for(info["assignment"])
        if spec is None:
            return nb, resources
        seed = secrets.randbits(48)
        rng = random.Random(seed)
        nb.metadata["grader_lab_seed"] = seed  # the draw, kept with the graded notebook for the record
        steps, answers, tests, references = self._program(nb, info, spec, rng)
        run = run_steps(steps, labspecs.probes_source(info["assignment"]), cell_timeout=self._timeout(),
                        grace=self._grace(), total_timeout=self.total_timeout, memory_bytes=self.memory_bytes,
                        sandbox=bool(self.config.GuardedExecute.get("sandbox", True)))
        if run.stopped:
            self.log.warning("Lab answers of %s: %s", ascii(info["student"]), run.stopped)
        kernel = {}  # what the student's kernel said of each test cell: the instructor compares, nothing scores it
        reasons = []
        for index, cell in tests:
            outcome = run.outcomes[index]
            grade_id = cell.metadata["nbgrader"]["grade_id"]
            failed = [o.get("ename", "Error") for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            kernel[grade_id] = f"failed ({known_name(failed[0])})" if failed else "passed"
            if outcome.error is not None:  # the grader's own words (labrun.FAILURES), never the report's text
                problem = outcome.error
                ename = "CellTimeoutError" if outcome.error.startswith("CellTimeoutError") else "AssertionError"
            elif not outcome.ran:
                problem, ename = f"not run: {run.stopped or 'the grading program ended before this test'}", "NotRun"
            else:
                try:
                    problem = spec.check(grade_id, references[index], outcome.result)
                except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
                    problem = f"the answer's data could not be read ({type(error).__name__})"
                ename = "AssertionError"
            if problem and "Withheld" in problem:
                problem = f"{problem}: {DELEGATION}"
            cell.outputs = verdict(problem, ename)
            # both kinds of mismatch go to the instructor: an answer that behaves one way when its kernel runs the
            # tests and another when the grader probes it is worth a look, whichever way round
            if failed and not problem:
                reasons.append(f"{grade_id}: failed in the student's kernel ({known_name(failed[0])}) but passed "
                               "the grader's checks")
            elif not failed and problem:
                reasons.append(f"{grade_id}: passed in the student's kernel but failed the grader's checks")
        nb.metadata["grader_kernel_tests"] = kernel
        found, copies = review(answers, self._others(info, answers), self._release(info, answers))
        reasons += found + [c.reason for c in copies]
        if copies:  # the evidence, both passages as written, for the instructor to compare side by side
            nb.metadata["grader_copies"] = [c.as_json() for c in copies]
        if reasons:
            resources.setdefault("grader_review", []).extend(reasons)
        return nb, resources

    def _others(self, info, answers) -> dict[str, dict[str, str]]:
        """The answer cells of every other submission of this assignment in the course (collusion), read from the
        submitted folders without following links (copied.read_answers)."""
        coursedir = getattr(getattr(self.parent, "parent", None), "coursedir", None)
        if coursedir is None:
            return {}
        pattern = coursedir.format_path(coursedir.submitted_directory, "*", info["assignment"])
        others = {}
        for folder in sorted(glob.glob(pattern)):
            student = os.path.basename(os.path.dirname(folder))
            if student != info["student"]:
                others[student] = read_answers(Path(folder) / f"{info['notebook']}.ipynb", answers)
        return others

    def _release(self, info, answers) -> dict[str, str]:
        """The answer cells as the release hands them out (the skeleton every student starts from)."""
        coursedir = getattr(getattr(self.parent, "parent", None), "coursedir", None)
        if coursedir is None:
            return {}
        folder = coursedir.format_path(coursedir.release_directory, ".", info["assignment"])
        return read_answers(Path(folder) / f"{info['notebook']}.ipynb", answers)

    def _timeout(self) -> int:
        return self.cell_timeout or int(self.config.Execute.get("timeout", 30) or 30)

    def _grace(self) -> int:
        return self.grace or int(self.config.GuardedExecute.get("interrupt_grace", 5) or 5)

    def _program(self, nb, info, spec, rng):
        """The steps to run, the answer cells' sources by grade_id, and the graded test cells with their step."""
        steps: list[Step] = []
        answers: dict[str, str] = {}
        tests = []
        references: dict[int, dict] = {}  # a test step's whole inputs, the check's (the probe gets probe_args)
        transform = TransformerManager().transform_cell
        with Gradebook(info["db_url"]) as gb:
            for cell in nb.cells:
                meta = cell.metadata.get("nbgrader", {})
                grade_id = meta.get("grade_id")
                if cell.cell_type != "code" or not grade_id:
                    continue  # markdown, and the student's own cells: not part of the answer
                if nbgrader_utils.is_grade(cell) and not nbgrader_utils.is_solution(cell):
                    if grade_id not in spec.GRADED:
                        raise ValueError(f"{info['assignment']}: no grader-side check for test cell {grade_id!r}")
                    tests.append((len(steps), cell))
                    references[len(steps)] = args = spec.inputs(grade_id, rng)
                    steps.append(Step(grade_id, probe=grade_id, args=labspecs.probe_args(spec, args)))
                elif nbgrader_utils.is_solution(cell):
                    answers[grade_id] = cell.source
                    steps.append(Step(grade_id, source=_python(transform, cell.source)))
                elif nbgrader_utils.is_locked(cell):
                    try:  # the instructor's text, whatever the submission holds
                        source = gb.find_source_cell(grade_id, info["notebook"], info["assignment"]).source
                    except MissingEntry:
                        continue
                    steps.append(Step(grade_id, source=_python(transform, source)))
        missing = set(spec.GRADED) - {c.metadata["nbgrader"]["grade_id"] for _, c in tests}
        if missing:
            self.log.warning("Test cells missing from the notebook: %s", ", ".join(sorted(missing)))
        return steps, answers, tests, references


def _python(transform, source: str) -> str:
    """A cell as plain Python: IPython's own rewriting of magics and `!` commands (they then fail harmlessly)."""
    try:
        return transform(source)
    except Exception:  # IPython could not read it: run it as written, and let Python say what is wrong
        return source


def verdict(problem: str | None, ename: str = "AssertionError") -> list:
    """A test cell's outputs as SaveAutoGrades reads them: no error is full points, an error none."""
    if problem is None:
        return [new_output("stream", name="stdout", text="passed: checked by the grader on inputs chosen at "
                                                         "grading time\n")]
    return [new_output("stream", name="stdout", text="failed: checked by the grader on inputs chosen at grading "
                                                     "time\n"),
            new_output("error", ename=ename, evalue=problem, traceback=[f"{ename}: {problem}"])]
