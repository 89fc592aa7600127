"""Refusing to sign while autograde's sandbox could read the issuer key.

Student code runs during autograde. If the key file is readable there, a submission can print it into its own
feedback and sign any badge it likes. The grader's sandbox (grading.sandbox) is the one place that knows
what a sandboxed kernel can see, so the question is put to it, never answered a second time here: certify asks
`sandbox_can_read(key_path)` and refuses when the answer is yes, or when the sandbox module is missing (then
nothing says the key is safe).
"""

from __future__ import annotations

from pathlib import Path

from .errors import CertError


def _sandbox_can_read(path: Path) -> bool:
    try:
        from grading.sandbox import sandbox_can_read
    except ImportError as e:
        raise CertError(f"cannot tell whether autograde's sandbox can read the issuer key ({e}); "
                        "certify signs only when it can tell that it cannot") from None
    return bool(sandbox_can_read(path))


def ensure_hidden_from_sandbox(key_path: Path | str) -> None:
    """CertError unless autograde's sandbox cannot read `key_path` (the file itself, resolved)."""
    path = Path(key_path).expanduser().resolve()
    if _sandbox_can_read(path):
        raise CertError(f"refusing to sign: {path} can be read by student code under autograde's sandbox. "
                        "Keep the key outside the course folder, the exchange and every folder the sandbox "
                        "binds (e.g. ~/.minialloc-issuer), or encrypt it with keygen --passphrase and still move it")
