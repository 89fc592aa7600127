"""The graded quiz's feedback preprocessor, kept under this name for configurations that list it.

The class lives with the grader's other preprocessors, in quizzes.grader.preprocessors (the labs use it too).
"""

from quizzes.grader.preprocessors import HideTestTracebacks

__all__ = ["HideTestTracebacks"]
