"""What a student wrote, made inert HTML wherever nbgrader renders it: an allow-list sanitizer (nh3, the Python
binding of the Rust crate Ammonia), not pattern checks.

nbgrader's feedback and formgrade templates render markdown cells with `cell.source | markdown2html` and never
clean the result; nbconvert's markdown renderer decodes entities in link targets, so `[x](javascript&colon;...)`
becomes a javascript: link. `markdown2html` here renders as nbconvert's HTMLExporter.markdown2html does (cell
attachments included), then cleans; `clean_html` cleans an HTML output. nbgrader_config.py registers both as the
HTMLExporter's filters (the feedback), and grading/browser_guard.py puts them into the formgrader's exporter.

The policy (`clean_html`):
- tags: text formatting, lists, tables, headings, code, links and images; nothing that runs, loads a document,
  takes input or styles the page (no script, style, svg, math, iframe, object, form, input, button);
- attributes: a short list, no event handler, no style; every id is prefixed with `user-content-` (and so are
  in-page links), so no element of the student's can stand for one of the page's own by its id;
- links (`a href`): http, https and mailto, and in-page anchors (#...); any other link (a relative one to a file
  of the submission, which the formgrader would serve from the course's origin, javascript:, data:) loses its
  href and stays as its text. The scheme is read after entity decoding (Ammonia parses the HTML first);
- images (`img src`): http, https, a relative path (an image tag runs no script whatever it loads) and data URLs
  of PNG, JPEG and GIF only.
"""

from __future__ import annotations

import re
from html import escape

import nh3
from jinja2 import pass_context

TAGS = frozenset(
    "a abbr b blockquote br caption code col colgroup dd del details div dl dt em h1 h2 h3 h4 h5 h6 hr i img ins "
    "kbd li ol p pre q s samp small span strike strong sub summary sup table tbody td tfoot th thead tr tt u ul "
    "var".split())
ATTRIBUTES = {
    "*": {"class", "id", "title", "align"},
    "a": {"href"},
    "img": {"src", "alt", "width", "height"},
    "ol": {"start"},
    "td": {"colspan", "rowspan"},
    "th": {"colspan", "rowspan"},
    "col": {"span"},
    "colgroup": {"span"},
}
# elements removed with their content (the others not allowed are removed and their text kept)
DROPPED_WITH_CONTENT = frozenset({"script", "style", "svg", "math", "template", "iframe", "object", "noscript"})
ID_PREFIX = "user-content-"
LINK = re.compile(r"(https?|mailto):", re.I)
IMAGE = re.compile(r"(https?:|data:image/(png|jpeg|gif);base64,)", re.I)
SCHEME = re.compile(r"[a-z][a-z0-9+.-]*:", re.I)
# control characters and spaces a browser strips from a URL before reading its scheme
URL_NOISE = re.compile(r"[\x00-\x20\x7f]+")


def _attribute(tag: str, name: str, value: str) -> str | None:
    """Ammonia's attribute_filter: what a URL may be, per tag (Ammonia has already decoded entities)."""
    if name not in ("href", "src"):
        return value
    url = URL_NOISE.sub("", value)
    if tag == "a" and name == "href":
        if url.startswith("#"):
            return "#" + ID_PREFIX + url[1:] if not url[1:].startswith(ID_PREFIX) else url
        return value if LINK.match(url) else None
    if tag == "img" and name == "src":
        return value if IMAGE.match(url) or not SCHEME.match(url) else None
    return None


def clean_html(html: str) -> str:
    """`html` with only the allow-listed tags, attributes and URLs left (see the module's docstring)."""
    return nh3.clean(
        str(html), tags=set(TAGS), clean_content_tags=set(DROPPED_WITH_CONTENT), attributes=ATTRIBUTES,
        attribute_filter=_attribute, url_schemes={"http", "https", "mailto", "data"}, strip_comments=True,
        link_rel="noopener noreferrer nofollow", id_prefix=ID_PREFIX)


def render_uncleaned(source: str, attachments: dict | None = None) -> str:
    """A markdown cell's HTML exactly as nbconvert's HTMLExporter renders it (nbconvert 7's
    HTMLExporter.markdown2html: IPythonRenderer with escape off, the cell's attachments inlined): not yet clean."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    renderer = IPythonRenderer(escape=False, attachments=dict(attachments or {}))
    return MarkdownWithMath(renderer=renderer).render(str(source))


def render_markdown(source: str, attachments: dict | None = None) -> str:
    """A markdown cell's HTML as nbconvert renders it, then cleaned."""
    return clean_html(render_uncleaned(source, attachments))


@pass_context
def markdown2html(context, source) -> str:
    """The `markdown2html` Jinja filter of nbconvert's HTMLExporter, cleaned: nbgrader's templates call it on
    every markdown cell (and on the grader's comments)."""
    cell = context.get("cell") or {}
    attachments = cell.get("attachments") if hasattr(cell, "get") else None
    return render_markdown("".join(source) if isinstance(source, list) else str(source or ""), attachments)


def escape_text(value: object) -> str:
    """A name or id the student chose (a student id, a notebook or file name), as HTML text."""
    return escape(str(value), quote=True)
