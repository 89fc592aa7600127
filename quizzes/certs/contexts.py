"""The JSON-LD context documents that eddsa-rdfc-2022 needs, served from the package: never the network.

RDF canonicalization expands a credential with the documents its @context names. Fetching them at verification
time would make verification depend on a web server (and let whoever answers for that URL change what a
credential means), so the two a credential may name, W3C Verifiable Credentials 2.0 and Open Badges 3.0.3, are
bundled in contexts/ (from npm registry packages: contexts/README.md names them and their licenses), each
pinned by its SHA-256 in contexts/index.json, so an
altered copy is refused. Any other URL is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from .errors import CertError

CONTEXT_DIR = Path(__file__).resolve().parent / "contexts"


@cache
def _index() -> dict[str, dict[str, str]]:
    return json.loads((CONTEXT_DIR / "index.json").read_text(encoding="utf-8"))


@cache
def _bundled_bytes(url: str) -> bytes:
    entry = _index().get(url)
    if entry is None:
        raise CertError(f"the context {url!r} is not one this verifier knows (it never fetches contexts)")
    raw = (CONTEXT_DIR / entry["file"]).read_bytes()
    if hashlib.sha256(raw).hexdigest() != entry["sha256"]:
        raise CertError(f"the bundled context file for {url} does not match its pinned SHA-256: reinstall")
    return raw


def bundled_context(url: str) -> dict[str, Any]:
    """The parsed context document for `url` (a fresh copy); CertError for a URL not bundled or an altered file."""
    return json.loads(_bundled_bytes(url))


Loader = Callable[[str, dict[str, Any] | None], dict[str, Any]]


def document_loader(extra: dict[str, dict[str, Any]] | None = None) -> Loader:
    """A pyld document loader over the bundled contexts (plus `extra`, for tests' own vectors)."""
    extra = dict(extra or {})

    def load(url: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        document = extra[url] if url in extra else bundled_context(url)
        return {"contextUrl": None, "documentUrl": url, "document": document}

    return load
