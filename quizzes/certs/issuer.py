"""The course's published issuer: which did:key `verify` accepts when no --issuer is given.

A valid signature only proves that the holder of SOME key signed: anyone can make a flawless credential with
their own key. What makes a certificate the course's is its issuer id, so `verify` compares it with the course's
published did, read from `issuer.json` (public: the did and a display name, never the private key), which the
instructor writes with `keygen --publish` and commits beside the course. The package's own copy,
quizzes/issuer.json, is the default; `--issuer did:key:...` or `--issuer path/to/issuer.json` overrides it.

A third party who has only the credential needs the same fact from somewhere the course controls: its web
domain. `did-web` writes the course's did:web document (W3C DID Core; the did:web method: did:web:example.org is
served at https://example.org/.well-known/did.json, did:web:example.org:gpu at https://example.org/gpu/did.json)
whose one verification method is the issuer key (a Multikey with the did:key's publicKeyMultibase) and whose
`alsoKnownAs` names the did:key. Anyone can then fetch it over HTTPS and compare, by hand or with
`verify --issuer did.json`, which takes the did:key from such a document after checking that both name one key.
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
    if isinstance(data, dict) and isinstance(data.get("id"), str) and data["id"].startswith("did:web:"):
        return CourseIssuer(did_key_of_did_web(data, str(path)), data["id"], str(path))
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != 1 \
            or not isinstance(data.get("id"), str) or not isinstance(data.get("name"), str):
        raise CertError(f"{path} is not an issuer file (format {FORMAT!r}, version 1, id, name)")
    public_key_from_did(data["id"])
    return CourseIssuer(data["id"], data["name"], str(path))


DID_CONTEXT = ["https://www.w3.org/ns/did/v1", "https://w3id.org/security/multikey/v1"]
_DOMAIN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")


def did_web(domain: str) -> tuple[str, str]:
    """(did:web id, the https URL its document is served at) for "example.org" or "example.org/some/path"."""
    host, _, path = domain.strip().lower().removeprefix("https://").strip("/").partition("/")
    parts = [p for p in path.split("/") if p]
    bad_host = not host or "." not in host or host.startswith((".", "-")) or host.endswith((".", "-")) \
        or not set(host) <= _DOMAIN_CHARS
    if bad_host or not all(set(p) <= _DOMAIN_CHARS | {"_"} for p in parts):
        raise CertError(f"{domain!r} is not a domain (and path) for did:web: write it like course.example.org or "
                        "example.org/gpu-course")
    did = ":".join(["did:web", host, *parts])
    url = f"https://{host}/{'/'.join(parts)}/did.json" if parts else f"https://{host}/.well-known/did.json"
    return did, url


def did_web_document(domain: str, did_key_id: str) -> tuple[dict[str, object], str]:
    """The did:web DID document naming `did_key_id`'s key, and the URL to serve it at."""
    public_key_from_did(did_key_id)
    did, url = did_web(domain)
    multibase = did_key_id.removeprefix("did:key:")
    method = f"{did}#{multibase}"
    document = {"@context": list(DID_CONTEXT), "id": did, "alsoKnownAs": [did_key_id],
                "verificationMethod": [{"id": method, "type": "Multikey", "controller": did,
                                        "publicKeyMultibase": multibase}],
                "assertionMethod": [method]}
    return document, url


def write_did_web(path: Path | str, domain: str, did_key_id: str) -> tuple[Path, str]:
    document, url = did_web_document(domain, did_key_id)
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:  # derived from the key: rewriting it changes nothing else
        json.dump(document, f, indent=2)
        f.write("\n")
    return path, url


def did_key_of_did_web(data: dict[str, object], source: str) -> str:
    """The did:key a did:web document vouches for: named in alsoKnownAs AND holding the same key as an
    assertionMethod, so a document cannot claim a key it does not carry."""
    did = data.get("id")
    aliases = data.get("alsoKnownAs")
    named = [a for a in aliases if isinstance(a, str) and a.startswith("did:key:")] if isinstance(aliases, list) else []
    methods = data.get("verificationMethod") or []
    asserting = {m for m in data.get("assertionMethod") or [] if isinstance(m, str)} \
        if isinstance(data.get("assertionMethod"), list) else set()
    keys = {m.get("publicKeyMultibase") for m in methods if isinstance(m, dict) and m.get("id") in asserting
            and m.get("controller") == did and m.get("type") == "Multikey"} if isinstance(methods, list) else set()
    matching = [a for a in named if a.removeprefix("did:key:") in keys]
    if not isinstance(did, str) or not did.startswith("did:web:") or len(matching) != 1:
        raise CertError(f"{source} is not a did:web document naming one did:key (in alsoKnownAs) whose key is "
                        "also its assertionMethod")
    public_key_from_did(matching[0])
    return matching[0]


def expected_issuer(override: str | None) -> CourseIssuer:
    """The issuer `verify` demands: --issuer (a did:key, an issuer file, or the course's did:web document),
    else the course's issuer file."""
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
