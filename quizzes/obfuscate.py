"""Keep practice answers out of plain sight: a SHA-256 keystream XOR, then base64.

The practice quiz needs its answers on the student's machine to give instant feedback, so they cannot be secret;
anyone who runs this module on the payload opens them. What it prevents is reading them by accident or at a
glance: in the quiz's data, in a saved notebook, with grep. That is all a practice quiz needs. Graded answers
never reach the student: they stay in the instructor's private bank and are scored in the grader's process
(quizzes.graded).

The keystream is SHA-256(salt | label | counter) blocks; the salt is random per quiz session and the label names
what is sealed (question id and field), so equal answers look different from question to question.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

PREFIX = "x1:"  # the scheme's version, so a later change can still read old payloads


def _keystream(salt: bytes, label: str, n: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(salt + b"|" + label.encode() + b"|" + counter.to_bytes(8, "big")).digest()
        counter += 1
    return bytes(out[:n])


def seal(value: Any, salt: bytes, label: str) -> str:
    """A JSON-able value as an opaque string."""
    data = json.dumps(value, ensure_ascii=False, sort_keys=True).encode()
    mixed = bytes(a ^ b for a, b in zip(data, _keystream(salt, label, len(data)), strict=True))
    return PREFIX + base64.urlsafe_b64encode(mixed).decode()


def unseal(token: str, salt: bytes, label: str) -> Any:
    """The value `seal` hid; ValueError if the token was not made by seal with this salt and label."""
    if not token.startswith(PREFIX):
        raise ValueError("not a sealed value")
    try:
        mixed = base64.urlsafe_b64decode(token[len(PREFIX):].encode())
        data = bytes(a ^ b for a, b in zip(mixed, _keystream(salt, label, len(mixed)), strict=True))
        return json.loads(data.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot open sealed value ({label}): {e}") from None
