"""One escaper for every string a student controls that reaches the grader's terminal, a log or a CSV file.

A submitted file's name, a student id, a cell's id or an exception's message can hold control characters: ANSI
escape sequences (erase a line, move the cursor, recolour), OSC sequences (a window title, an OSC 52 clipboard
write, a hyperlink), a carriage return or a newline that forges a log line of its own, and Unicode's bidirectional
controls that reorder what a reader sees. `escaped` shows each as a Python escape (`\\x1b`, `\\n`, `\\u202e`),
so it is displayed, never sent; every other character (a learner's name in Vietnamese included) is kept.

`install_log_escaper` puts it in front of every log record the grader's process makes (logging's record
factory): the message and the formatted traceback are escaped before any handler sees them, whoever logged them
(nbgrader, nbconvert, traitlets or the grader), so a handler or formatter added later needs nothing of its own.
grading.export uses it for the CSV's fields.
"""

from __future__ import annotations

import logging
import re

# C0 controls but tab, DEL and the C1 controls, the line and paragraph separators, the bidirectional marks,
# embeddings, overrides and isolates
CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    if match.group(0) in "\n\r":
        return "\\n" if match.group(0) == "\n" else "\\r"
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escaped(text: object) -> str:
    """`text` with every control character shown as an escape (a newline too: no line of its own)."""
    return CONTROL.sub(_escape, str(text))


def escaped_lines(text: str) -> str:
    """The same, keeping the newlines (a traceback the grader formatted is several lines, each escaped)."""
    return "\n".join(escaped(line) for line in text.split("\n"))


def _escaping_factory(previous):
    def factory(*args, **kwargs) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: logging reports it at format time; keep the record as it was
            return record
        record.msg, record.args = escaped(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = escaped_lines(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = escaped_lines(record.stack_info)
        return record

    factory.escapes = True
    return factory


def install_log_escaper() -> None:
    """Escape every log record of this process from now on (once; a second call changes nothing)."""
    previous = logging.getLogRecordFactory()
    if not getattr(previous, "escapes", False):
        logging.setLogRecordFactory(_escaping_factory(previous))
