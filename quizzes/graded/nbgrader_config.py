"""nbgrader settings for the graded quizzes; nbgrader reads this file when run from quizzes/graded/.

    cd quizzes/graded
    nbgrader generate_assignment quiz1          # source/quiz1 -> release/quiz1 (no solutions, no hidden tests)
    nbgrader collect quiz1 / or copy submissions to submitted/<student>/quiz1/
    nbgrader autograde quiz1                    # runs each submission from the top; hidden tests restored
    python -m quizzes passmark --gradebook sqlite:///gradebook.db --assignment quiz1        # 80%
    python -m quizzes certify --gradebook sqlite:///gradebook.db --assignment quiz1 --key KEY --out certificates

The grader's environment needs this repository's `quizzes` and `minialloc` importable (pip install -e .).
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "nbgrader_config.py"  # the repository's grader settings, shared with the labs

# The shared file hardens autograde (a dying or hanging kernel, output floods, deleted or retyped test cells,
# code that reaches into the interpreter); take all of it, then make this folder a course of its own.
if SHARED.is_file():
    load_subconfig(str(SHARED))  # noqa: F821 (traitlets defines load_subconfig when it runs this file)

c = get_config()  # noqa: F821 (traitlets defines get_config when it runs this file)

c.CourseDirectory.root = str(HERE)

# Feedback is made from the autograded notebook, which holds the hidden tests again: clear them, and cut the
# tracebacks of failed tests (they quote the failing line), or every student's feedback would show the key.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    "quizzes.graded.feedback.HideTestTracebacks",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
