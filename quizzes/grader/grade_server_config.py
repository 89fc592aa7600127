"""Jupyter Server settings for the JupyterLab that grades (`make grade`, `make grade-quiz` pass it with --config).

It loads quizzes.grader.browser_guard beside nbgrader's own extensions: a Content-Security-Policy on the
formgrader's pages and on the files JupyterLab and the formgrader serve, and the formgrader's templates escaped
and sanitized. See docs/grading.md, "The instructor's browser".
"""

c = get_config()  # noqa: F821 -- traitlets defines get_config() when it loads this file

c.ServerApp.jpserver_extensions = {"quizzes.grader.browser_guard": True}
