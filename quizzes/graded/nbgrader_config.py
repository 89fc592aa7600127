"""nbgrader settings for the graded quizzes; nbgrader reads this file when run from quizzes/graded/.

    cd quizzes/graded
    python -m quizzes build-graded --bank PRIVATE_DIR            # source/quiz1 from the private bank (prompts only)
    nbgrader generate_assignment quiz1                          # source/quiz1 -> release/quiz1
    nbgrader collect quiz1 / or copy submissions to submitted/<student>/quiz1/
    nbgrader autograde quiz1 --QuizGrade.bank_dir=PRIVATE_DIR   # or: export MINIALLOC_PRIVATE_BANK=PRIVATE_DIR
    nbgrader generate_feedback quiz1
    python -m quizzes certify --gradebook sqlite:///gradebook.db --assignment quiz1 --key KEY --out certificates

The grader's environment needs this repository's `quizzes` and `minialloc` importable (pip install -e .). The
answers are scored in the grader's process by QuizGrade (grading/preprocessors.py) from the private bank
and the course secret; the student's kernel runs in the sandbox and sees neither.
"""

import os
from pathlib import Path

from grading.preprocessors import ErrorsFailTests, QuizGrade, insert_around

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "nbgrader_config.py"  # the repository's grader settings, shared with the labs

# The shared file installs the grader: the sandbox, guarded execution, test cells restored, tags stripped,
# review flags, feedback without hidden tests or keys. Take all of it, then make this folder a course of its own.
load_subconfig(str(SHARED))  # noqa: F821 (traitlets defines load_subconfig when it runs this file)

c = get_config()  # noqa: F821 (traitlets defines get_config when it runs this file)

c.CourseDirectory.root = str(HERE)

# The scores come from the grader's process, after the kernel is done: QuizGrade replaces the slot cells' outputs
# with its verdict before nbgrader saves the grades.
c.Autograde.autograde_preprocessors = insert_around(c.Autograde.autograde_preprocessors, ErrorsFailTests,
                                                    before=[QuizGrade])
# The notebook's locked cells import quizzes.graded.student (the draw and the shape checks; no answers): the
# sandbox binds the quizzes package too. This folder is also the course's root, so the kernel sees only its Python
# files: source/, release/, submitted/, autograded/, feedback/, gradebook.db, the log and anything else here that
# is not a .py file are shown empty.
c.SandboxKernelManager.packages = ["minialloc", "quizzes"]
c.SandboxKernelManager.code_only = [str(HERE)]
c.SandboxKernelManager.hidden = [str(HERE / name) for name in (
    "source", "release", "submitted", "autograded", "feedback", "exchange", "gradebook.db", ".nbgrader.log")]
# Every output of a test cell is QuizGrade's verdict (the kernel's are replaced): the feedback shows it.
c.HideTestTracebacks.keep_test_output = True
# The course secret must not leave in feedback either (nor the issuer key, from the shared file).
_bank = os.environ.get("MINIALLOC_PRIVATE_BANK", "")
if _bank:
    c.QuizGrade.bank_dir = _bank
    c.ScanForKeys.key_files = [*c.ScanForKeys.key_files, os.path.join(_bank, "course.secret")]
