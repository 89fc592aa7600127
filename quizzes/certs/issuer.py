"""The course's published issuer: which did:key `verify` accepts when no --issuer is given.

A valid signature only proves that the holder of SOME key signed: anyone can make a flawless credential with
their own key. What makes a certificate the course's is its issuer id, so `verify` compares it with the course's
published did, read from `issuer.json` (public: the did and a display name, never the private key), which the
instructor writes with `keygen --publish` and commits beside the course. The package's own copy,
quizzes/issuer.json, is the default; `--issuer did:key:...` or `--issuer path/to/issuer.json` overrides it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .. import strict_json
from .errors import CertError
from .keys import public_key_from_did

ISSUER_FILE = "issuer.json"
FORMAT = "minialloc-course-issuer"
MAX_FILE_BYTES = 64 * 1024


def default_issuer_path() -> Path:
    """quizzes/issuer.json, installed with the package (package data) and committed with the course."""
    return Path(__file__).resolve().parent.parent / ISSUER_FILE


@dataclass(frozen=True)
class CourseIssuer:
    did: str
    name: str
    source: str  # where it was read from, for messages


def write_issuer_file(path: Path | str, did: str, name: str) -> Path:
    """Write the public issuer file; refuses to overwrite (a new key is a new issuer: replace it on purpose)."""
    public_key_from_did(did)
    path = Path(path).expanduser()
    if path.exists():
        raise CertError(f"refusing to overwrite {path}: remove it first if the course really has a new issuer key")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("x", encoding="utf-8") as f:
        json.dump({"format": FORMAT, "version": 1, "id": did, "name": name}, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return path


def read_issuer_file(path: Path | str) -> CourseIssuer:
    path = Path(path).expanduser()
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise CertError(f"cannot read the course issuer file {path}: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise CertError(f"{path} is larger than {MAX_FILE_BYTES} bytes: not an issuer file")
    try:
        data = strict_json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CertError(f"{path} is not a valid issuer file: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != 1 \
            or not isinstance(data.get("id"), str) or not isinstance(data.get("name"), str):
        raise CertError(f"{path} is not an issuer file (format {FORMAT!r}, version 1, id, name)")
    public_key_from_did(data["id"])
    return CourseIssuer(data["id"], data["name"], str(path))


def expected_issuer(override: str | None) -> CourseIssuer:
    """The issuer `verify` demands: --issuer (a did:key or an issuer file), else the course's issuer file."""
    if override:
        text = override.strip()
        if text.startswith("did:"):
            public_key_from_did(text)
            return CourseIssuer(text, "", "--issuer")
        return read_issuer_file(text)
    path = default_issuer_path()
    if not path.is_file():
        raise CertError(f"this installation names no course issuer ({path} is missing), so no credential can be "
                        "checked against it: give --issuer did:key:... (the course's published issuer id) or "
                        "--issuer FILE (its issuer.json); an instructor writes it with keygen --publish")
    return read_issuer_file(path)


def describe_source(issuer: CourseIssuer) -> str:
    if issuer.source == "--issuer":
        return "the --issuer given"
    if Path(issuer.source) == default_issuer_path():
        return "the course's issuer"
    return f"the issuer in {os.path.basename(issuer.source)}"
