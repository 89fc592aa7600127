"""The printable certificate beside a credential: an HTML page (print it, or save it as PDF from a browser) and a
PNG drawn with matplotlib. Both show the learner's name, the course, the date, the score and the verification
ID, which `python -m quizzes verify` prints for the credential file, so a reader can match paper and file.

The name appears only here, never in the credential (which holds its salted hash).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, BinaryIO

from ..i18n import CERT, check_lang
from .credential import verification_id
from .display import shown

NAME_LIMIT = 200  # characters of a name shown; more is cut with an ellipsis


def visible(text: object, limit: int = NAME_LIMIT) -> str:
    return shown(text, limit, keep_backslash=True)


def _fields(credential: dict[str, Any], name: str, score_text: str, lang: str, file_name: str) -> dict[str, str]:
    # the learner's name, the course's and the issuer's are typed by people: a control character or a bidi
    # override (U+202E reverses what follows on screen and on paper) is shown as a visible escape (\u202e)
    t = {key: text[check_lang(lang)] for key, text in CERT.items()}
    return {
        "heading": t["heading"],
        "awarded": t["awarded"],
        "name": visible(name, NAME_LIMIT),
        "for_passing": t["for_passing"],
        "course": visible(credential["credentialSubject"]["achievement"]["name"], NAME_LIMIT),
        "score": t["score"].format(score=visible(score_text)),
        "date": t["date"].format(date=visible(credential["validFrom"][:10])),
        "issuer": t["issuer"].format(issuer=visible(credential["issuer"]["name"], NAME_LIMIT)),
        "id_label": t["verification_id"],
        "vid": verification_id(credential),
        "verify": t["how_to_verify"].format(file=visible(file_name)),
        "did": visible(credential["issuer"]["id"]),
    }


def certificate_html(credential: dict[str, Any], name: str, score_text: str, lang: str = "en",
                     file_name: str = "credential.json") -> str:
    f = {k: html.escape(v) for k, v in _fields(credential, name, score_text, lang, file_name).items()}
    return f"""<!DOCTYPE html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<title>{f['heading']}: {f['name']}</title>
<style>
  @page {{ size: A4 landscape; margin: 12mm; }}
  body {{ font-family: Georgia, 'DejaVu Serif', serif; color: #1d2733; margin: 0; }}
  .sheet {{ border: 6px double #2b5d8a; padding: 40px 56px; margin: 24px auto; max-width: 960px;
            text-align: center; }}
  h1 {{ font-size: 34px; letter-spacing: 2px; text-transform: uppercase; color: #2b5d8a; margin: 0 0 24px; }}
  .name {{ font-size: 40px; font-weight: bold; margin: 12px 0 20px; }}
  .course {{ font-size: 26px; font-style: italic; margin: 8px 0 24px; }}
  .meta {{ font-size: 17px; margin: 4px 0; }}
  .vid {{ font-family: 'DejaVu Sans Mono', monospace; font-size: 22px; letter-spacing: 3px; margin: 24px 0 6px; }}
  .small {{ font-size: 12px; color: #55606d; word-break: break-all; }}
</style>
</head>
<body>
<div class="sheet">
  <h1>{f['heading']}</h1>
  <div class="meta">{f['awarded']}</div>
  <div class="name">{f['name']}</div>
  <div class="meta">{f['for_passing']}</div>
  <div class="course">{f['course']}</div>
  <div class="meta">{f['score']}</div>
  <div class="meta">{f['date']}</div>
  <div class="meta">{f['issuer']}</div>
  <div class="vid">{f['id_label']}: {f['vid']}</div>
  <div class="small">{f['verify']}</div>
  <div class="small">{f['did']}</div>
</div>
</body>
</html>
"""


def certificate_png(credential: dict[str, Any], name: str, score_text: str, path: Path | BinaryIO,
                    lang: str = "en", file_name: str = "credential.json") -> Path | BinaryIO:
    """Draw the certificate as an A4-landscape PNG (matplotlib, Agg backend: no display needed) into a file or
    a binary stream. Text is drawn literally: a name like `$\\bad$` is not mathtext (parse_math=False)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    f = _fields(credential, name, score_text, lang, file_name)
    fig = Figure(figsize=(11.69, 8.27), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    ax.add_patch(Rectangle((0.03, 0.04), 0.94, 0.92, fill=False, linewidth=4, edgecolor="#2b5d8a"))
    ax.add_patch(Rectangle((0.045, 0.06), 0.91, 0.88, fill=False, linewidth=1, edgecolor="#2b5d8a"))
    lines = [
        (0.86, f["heading"].upper(), 26, "bold", "#2b5d8a", "serif"),
        (0.76, f["awarded"], 15, "normal", "#1d2733", "serif"),
        (0.67, f["name"], 32, "bold", "#1d2733", "serif"),
        (0.58, f["for_passing"], 15, "normal", "#1d2733", "serif"),
        (0.51, f["course"], 22, "normal", "#1d2733", "serif"),
        (0.42, f["score"], 14, "normal", "#1d2733", "serif"),
        (0.37, f["date"], 14, "normal", "#1d2733", "serif"),
        (0.32, f["issuer"], 14, "normal", "#1d2733", "serif"),
        (0.22, f"{f['id_label']}: {f['vid']}", 20, "bold", "#1d2733", "monospace"),
        (0.15, f["verify"], 10, "normal", "#55606d", "sans-serif"),
        (0.11, f["did"], 8, "normal", "#55606d", "monospace"),
    ]
    for y, text, size, weight, color, family in lines:
        ax.text(0.5, y, text, ha="center", va="center", fontsize=size, fontweight=weight, color=color,
                family=family, parse_math=False, usetex=False)
    fig.savefig(path, dpi=100, format="png")
    return path
