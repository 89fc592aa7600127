"""A feedback preprocessor that keeps the answer key out of the students' feedback.

nbgrader makes feedback from the autograded notebook, where the hidden tests are back in the test cells.
ClearHiddenTests removes them from the cells' source, but a failed hidden assert still prints its own line in
the traceback (`----> 4 assert Q.normalize_choice(answers["q01"]) == "c"`): the key. This preprocessor cuts the
tracebacks of autograder test cells down to the exception's name and message, so the visible checks keep their
hints ("answers['q01'] must be one of the letters a, b, c, d") and the hidden ones say only that they failed.
Listed in quizzes/graded/nbgrader_config.py under GenerateFeedback.preprocessors.
"""

from __future__ import annotations

from nbconvert.preprocessors import Preprocessor
from nbformat.notebooknode import NotebookNode
from traitlets import Bool


def _is_test_cell(cell: NotebookNode) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


class HideTestTracebacks(Preprocessor):
    enabled = Bool(True)  # nbconvert preprocessors are off unless enabled; listing it in the config means "on"

    def preprocess_cell(self, cell: NotebookNode, resources: dict, index: int) -> tuple[NotebookNode, dict]:
        if _is_test_cell(cell):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    message = output.get("evalue") or "a hidden test failed"
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {message}"]
        return cell, resources
