"""generate_feedback with a time limit per notebook, so that one student's feedback cannot hold up the class.

The caps of GuardedExecute and Autograde.max_notebook_bytes bound what an autograded notebook holds; rendering it
to HTML is then bounded too, but only as well as nbconvert's and mistune's worst cases on the student's text are.
`TimedGenerateFeedback` stops a notebook's conversion after `notebook_timeout` seconds (a SIGALRM timer, which
only the main thread can take: elsewhere the notebook runs without one, and the log says so). The timeout is an
ordinary exception: nbgrader's converter logs it for that student, removes that student's partial feedback and
goes on with the others, as it does for any failure.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from nbgrader.converters.generate_feedback import GenerateFeedback
from traitlets import Float


class FeedbackTimeout(Exception):
    """A notebook's feedback took longer than GenerateFeedback.notebook_timeout."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str, log=None) -> Iterator[None]:
    """Raise FeedbackTimeout in the main thread after `seconds` (no limit when `seconds` <= 0 or off the main
    thread)."""
    if seconds <= 0:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        if log is not None:
            log.warning("No time limit for %s: not on the main thread", what)
        yield
        return

    def expired(signum, frame):
        raise FeedbackTimeout(f"{what} took more than {seconds:g} s (GenerateFeedback.notebook_timeout)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class TimedGenerateFeedback(GenerateFeedback):
    """nbgrader's GenerateFeedback, each notebook within notebook_timeout seconds."""

    notebook_timeout = Float(
        120.0, help="Seconds to make one notebook's feedback; past it that student's feedback fails (0: no limit)."
    ).tag(config=True)

    def convert_single_notebook(self, notebook_filename: str) -> None:
        with time_limit(self.notebook_timeout, f"the feedback of {ascii(notebook_filename)}", self.log):
            super().convert_single_notebook(notebook_filename)
