"""Writing a signed credential and its printable certificate side by side, never over existing files."""

from __future__ import annotations

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
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("x", encoding="utf-8") as f:
        json.dump(credential, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with html_path.open("x", encoding="utf-8") as f:
        f.write(certificate_html(credential, name, score_text, lang, file_name=path.name))
    written = [path, html_path]
    try:
        certificate_png(credential, name, score_text, png_path, lang, file_name=path.name)
        written.append(png_path)
    except ImportError:  # matplotlib is in the course extras; without it the HTML still prints (or saves as PDF)
        pass
    return written
