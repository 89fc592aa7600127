"""`nbgrader export` as a CSV that a spreadsheet reads as data: every field quoted, no field a formula.

nbgrader 0.9's CsvExportPlugin joins the fields with commas, unquoted: a student id `eve,,,,35.0,0.0,35.0,35.0`
writes a row of its own, and an id or name starting with `=` (or +, -, @, a tab, a carriage return) is a formula
when the file is opened in a spreadsheet. SafeCsvExportPlugin writes the same columns and rows as nbgrader's
plugin (its export(), mirrored), through Python's csv module with every field quoted, and a text field that
starts with a formula prefix gets a leading apostrophe (OWASP's "CSV injection" advice), so a spreadsheet shows
it as text; a control character in a field is written as its escape (grading/escape.py). nbgrader_config.py
sets it as `c.ExportApp.plugin_class`.
"""

from __future__ import annotations

import csv

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins.export import ExportPlugin

from .escape import escaped

COLUMNS = ("assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email", "raw_score",
           "late_submission_penalty", "score", "max_score")
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def inert_field(value: object) -> str:
    """A value as CSV text: empty for None, numbers as nbgrader writes them, text that could start a formula
    behind an apostrophe."""
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    text = escaped(value)  # a control character shown as an escape (grading/escape.py), never written
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


class SafeCsvExportPlugin(ExportPlugin):
    """nbgrader's CsvExportPlugin, quoted and formula-free, control characters escaped (see the module's docstring)."""

    def export(self, gradebook: Gradebook) -> None:
        dest = self.to or "grades.csv"
        students = {str(s) for s in self.student}
        assignments = {str(a) for a in self.assignment}
        self.log.info("Exporting grades to %s", dest)
        with open(dest, "w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out, quoting=csv.QUOTE_ALL)
            writer.writerow(COLUMNS)
            for assignment in gradebook.assignments:
                if assignments and assignment.name not in assignments:
                    continue
                for student in gradebook.students:
                    if students and student.id not in students:
                        continue
                    writer.writerow([inert_field(v) for v in _row(gradebook, assignment, student)])


def _row(gradebook: Gradebook, assignment, student) -> tuple:
    """One row, as nbgrader's CsvExportPlugin computes it: no submission scores 0."""
    try:
        submission = gradebook.find_submission(assignment.name, student.id)
    except MissingEntry:
        timestamp, raw, penalty, score = "", 0.0, 0.0, 0.0
    else:
        timestamp, raw, penalty = submission.timestamp, submission.score, submission.late_submission_penalty
        score = max(0.0, raw - penalty)
    return (assignment.name, assignment.duedate, timestamp, student.id, student.last_name, student.first_name,
            student.email, raw, penalty, score, assignment.max_score)
