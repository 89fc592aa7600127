"""The graded quiz: questions from the instructor's private bank, answers as data, graded in the grader's process.

Nothing in this package knows a graded answer. The instructor keeps a private bank folder (quiz definitions,
choice answers, what each diagnosis option means) and a course secret; `python -m quizzes build-graded --bank
PRIVATE_DIR` turns them into an nbgrader source notebook of prompts only. The modules, one idea each:

- private_bank: the private bank's format, checked field by field;
- secret: the course secret file and the HMAC-derived randomness only its holder can reproduce;
- diagnosis: scenarios run on minialloc (an OOM message, a segment map, a snapshot excerpt) and what they mean;
- pool: the bank made concrete with the secret: prompts, answer forms, expected answers (instructor-side);
- draw: the public per-student draw of questions from the pool (the same in the kernel and in the grader);
- answers: reading `answers["p07"] = ...` from a notebook's source, and checking an answer's shape;
- scoring: grade_notebook(nb, student_id, bank_dir, secret), called by the grader's nbgrader preprocessor;
- student: what the notebook's locked cells call (list my questions, check the shape of my answers);
- build: the notebook, and the build record the grader checks.
"""

from __future__ import annotations

from .answers import AnswerError, AnswerForm, read_answers
from .scoring import GradingSetupError, QuestionScore, grade_notebook

__all__ = ["AnswerError", "AnswerForm", "GradingSetupError", "QuestionScore", "grade_notebook", "read_answers"]
