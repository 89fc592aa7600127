"""Where the passphrase of an encrypted issuer key comes from: a prompt, a file, or an environment variable.

Never from a command-line argument: argv is visible to every user in `ps` and lands in shell history. A file
(mode 0600, like the key) or a variable suits scripts; the prompt (no echo) suits a person at a terminal.
"""

from __future__ import annotations

import getpass
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import CertError

# PKCS#8 as cryptography writes it (PBES2: PBKDF2-HMAC-SHA256, 2048 rounds, AES-256-CBC) slows guessing only a
# little: the passphrase itself must be strong
MIN_LENGTH = 12
MAX_FILE_BYTES = 4096


@dataclass(frozen=True)
class PassphraseSource:
    """How to get the passphrase; all None means: prompt at the terminal."""

    file: Path | None = None
    env: str | None = None

    def read(self, *, purpose: str, confirm: bool = False) -> bytes:
        if self.file is not None and self.env is not None:
            raise CertError("give the passphrase one way: --passphrase-file or --passphrase-env, not both")
        if self.file is not None:
            return _checked(_from_file(Path(self.file).expanduser()), f"the passphrase in {self.file}")
        if self.env is not None:
            value = os.environ.get(self.env)
            if value is None:
                raise CertError(f"the environment variable {self.env} (--passphrase-env) is not set")
            return _checked(value.encode(), f"${self.env}")
        return _prompt(purpose, confirm)


def _checked(secret: bytes, where: str) -> bytes:
    if not secret:
        raise CertError(f"{where} is empty")
    return secret


def _from_file(path: Path) -> bytes:
    try:
        mode = path.stat().st_mode
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise CertError(f"cannot read the passphrase file {path}: {e.strerror or e}") from None
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CertError(f"{path} can be read by other users (mode {stat.S_IMODE(mode):04o}); run: chmod 600 {path}")
    if len(data) > MAX_FILE_BYTES:
        raise CertError(f"{path} is larger than {MAX_FILE_BYTES} bytes: not a passphrase file")
    return data.rstrip(b"\r\n")  # editors add a final newline; it is not part of the passphrase


def _prompt(purpose: str, confirm: bool) -> bytes:
    if not sys.stdin.isatty():
        raise CertError(f"the passphrase {purpose} is needed and there is no terminal to ask on: "
                        "give --passphrase-file FILE or --passphrase-env VARIABLE")
    secret = getpass.getpass(f"Passphrase {purpose}: ").encode()
    if confirm and getpass.getpass("Again, to confirm: ").encode() != secret:
        raise CertError("the two passphrases differ")
    return _checked(secret, "the passphrase")


def new_passphrase(source: PassphraseSource) -> bytes:
    """A passphrase for a new key, long enough to be worth encrypting with."""
    secret = source.read(purpose="for the new issuer key", confirm=True)
    if len(secret) < MIN_LENGTH:
        raise CertError(f"the passphrase has {len(secret)} bytes; use at least {MIN_LENGTH}")
    return secret
