"""The course secret: the instructor's random key from which every graded variant and option order is derived.

The graded questions' scenarios (their numbers), the order of their options (so the letters) and therefore the
expected answers all follow from HMAC-SHA-256(secret, what is drawn). Without the secret, the public generators
in quizzes.graded.diagnosis cannot be steered to the variant a student sees. The secret lives in a file the
instructor keeps with the private bank (mode 0600, never in the package, the repository or the release);
`python -m quizzes build-graded --new-secret` makes one.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import secrets
import stat
from pathlib import Path

SECRET_BYTES = 32  # 256 bits: as strong as the HMAC it keys
DEFAULT_SECRET_NAME = "course.secret"  # looked for in the private bank folder when no file is named


class SecretError(ValueError):
    """A missing, weak or over-exposed secret file."""


def default_secret_path(bank_dir: Path) -> Path:
    return Path(bank_dir) / DEFAULT_SECRET_NAME


def _git_work_tree(path: Path) -> Path | None:
    for folder in [path, *path.parents]:
        if (folder / ".git").exists():
            return folder
    return None


def new_secret(path: Path) -> Path:
    """Create a secret file (mode 0600, O_EXCL: an existing secret is never replaced, it would re-key the quiz).
    Refuses a place inside a git work tree: one `git add -A` would publish every answer."""
    path = Path(path)
    repo = _git_work_tree(path.resolve().parent)
    if repo is not None:
        raise SecretError(f"refusing to write the course secret inside the git work tree {repo}: keep it with the "
                          "private bank, outside every repository (or name another place with --secret-file)")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise SecretError(f"{path} exists: a new secret would change every question; delete it first if you "
                          "mean it") from None
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(secrets.token_hex(SECRET_BYTES) + "\n")
    return path


def load_secret(path: Path) -> bytes:
    """The secret's bytes. Refuses a file that others can read: the secret is the whole answer key."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        raise SecretError(f"no course secret at {path}: create one with "
                          "`python -m quizzes build-graded --bank DIR --new-secret`") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SecretError(f"{path}: cannot read the course secret ({e})") from None
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretError(f"{path} can be read by other users (mode {stat.filemode(mode)}): chmod 600 it")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise SecretError(f"{path}: the course secret must be hex digits") from None
    if len(raw) < SECRET_BYTES:
        raise SecretError(f"{path}: the course secret must hold at least {SECRET_BYTES} bytes ({2 * SECRET_BYTES} "
                          "hex digits)")
    return raw


def derive(secret: bytes, *parts: str) -> bytes:
    """HMAC-SHA-256 of the parts (joined by a separator they cannot contain unescaped)."""
    message = "\x1f".join(p.replace("\x1f", "\x1f\x1f") for p in parts).encode("utf-8")
    return hmac.new(secret, message, hashlib.sha256).digest()


def rng(secret: bytes, *parts: str) -> random.Random:
    """A random.Random that only the holder of the secret can reproduce."""
    return random.Random(int.from_bytes(derive(secret, *parts), "big"))


def fingerprint(secret: bytes) -> str:
    """A short public tag of the secret (which one built a release), that reveals nothing of it."""
    return derive(secret, "fingerprint").hex()[:16]
