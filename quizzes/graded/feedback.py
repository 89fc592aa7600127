"""The graded quiz's feedback preprocessor, kept under this name for configurations that list it.

The class lives with the grader's other preprocessors, in grading.preprocessors (the labs use it too).
"""

from grading.preprocessors import HideTestTracebacks

__all__ = ["HideTestTracebacks"]
