"""Writing a signed credential and its printable certificate side by side, never over existing files.

Everything is rendered first and written after, so a certificate that cannot be drawn leaves no credential
behind, and a write that fails half way removes what it had written.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from .errors import CertError
from .printable import certificate_html, certificate_png


def certificate_paths(credential_path: Path) -> tuple[Path, Path]:
    """alice.credential.json -> alice.certificate.html, alice.certificate.png (beside it)."""
    stem = credential_path.name.removesuffix(".json").removesuffix(".credential")
    return (credential_path.with_name(f"{stem}.certificate.html"),
            credential_path.with_name(f"{stem}.certificate.png"))


def write_credential_files(credential: dict[str, Any], path: Path | str, *, name: str, score_text: str,
                           lang: str = "en") -> list[Path]:
    """Write the credential JSON, the HTML certificate and the PNG; returns the paths written."""
    path = Path(path)
    html_path, png_path = certificate_paths(path)
    for p in (path, html_path, png_path):
        if p.exists():
            raise CertError(f"refusing to overwrite {p}")
    text = json.dumps(credential, indent=2, ensure_ascii=False) + "\n"
    page = certificate_html(credential, name, score_text, lang, file_name=path.name)
    png: bytes | None = None
    try:
        buffer = io.BytesIO()
        certificate_png(credential, name, score_text, buffer, lang, file_name=path.name)
        png = buffer.getvalue()
    except ImportError:  # matplotlib is in the course extras; without it the HTML still prints (or saves as PDF)
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    try:
        for target, content in ((path, text), (html_path, page), (png_path, png)):
            if content is None:
                continue
            if isinstance(content, bytes):
                with target.open("xb") as f:
                    written.append(target)
                    f.write(content)
            else:
                with target.open("x", encoding="utf-8") as f:
                    written.append(target)
                    f.write(content)
    except BaseException:
        for done in written:
            done.unlink(missing_ok=True)
        raise
    return written
