"""The grader's browser defences piece by piece, without a browser or nbgrader run: the allow-list sanitizer
(grading/sanitize.py), the feedback exporter as nbgrader_config.py sets it up, InertOutputs' markdown check,
the quoted CSV export (grading/export.py) and the formgrader's policy and nonces
(grading/browser_guard.py). tests/test_grading_browser.py shows the same in Chromium through the real
pipeline."""

from __future__ import annotations

import base64
import csv
import hashlib
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from traitlets.config.loader import PyFileConfigLoader

from grading import browser_guard as guard
from grading import preprocessors as P
from grading.export import SafeCsvExportPlugin, inert_field
from grading.sanitize import ATTRIBUTES, ID_PREFIX, TAGS, clean_html, render_markdown

ROOT = Path(__file__).resolve().parent.parent
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n fake").decode()

# a javascript: URL spelled every way a browser still reads as one
SCHEMES = ["javascript:", "javascript&colon;", "javascript&#58;", "javascript&#x3a;", "java&#115;cript:",
           "JaVaScRiPt:", " javascript:", "java\tscript:", "javascript&NewLine;:", "&#106;avascript:"]


class Elements(HTMLParser):
    """Every start tag of a piece of HTML with its attributes, as a browser reads them (entities decoded)."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, dict[str, str]]] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, {k: v or "" for k, v in attrs}))

    handle_startendtag = handle_starttag


def policy_breaches(text: str) -> list[str]:
    """What in this HTML the policy forbids: a tag or attribute not allowed, a link or image URL outside it."""
    breaches = []
    for tag, attrs in Elements(text).found:
        if tag not in TAGS:
            breaches.append(f"tag {tag}")
        for name, value in attrs.items():
            allowed = ATTRIBUTES.get(tag, set()) | ATTRIBUTES["*"] | ({"rel"} if tag == "a" else set())
            if name not in allowed:
                breaches.append(f"{tag} {name}")
            url = re.sub(r"[\x00-\x20\x7f]+", "", value)
            if name == "href" and not re.match(r"(https?:|mailto:|#)", url, re.I):
                breaches.append(f"href {value!r}")
            if name == "src" and re.match(r"[a-z][a-z0-9+.-]*:", url, re.I) and not re.match(
                    r"(https?:|data:image/(png|jpeg|gif);base64,)", url, re.I):
                breaches.append(f"src {value!r}")
    return breaches


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_javascript_link_loses_its_target_however_it_is_spelled(scheme):
    for source in (f"[click]({scheme}alert(1))", f'<a href="{scheme}alert(1)">click</a>'):
        shown = render_markdown(source)
        assert "click" in shown and not policy_breaches(shown), (source, shown)
        assert not [a for t, a in Elements(shown).found if a.get("href")], shown  # a link to nowhere, or text


def test_what_stays_and_what_goes():
    shown = render_markdown(
        "# Heading\n\n[docs](https://example.org) [mail](mailto:a@example.org) [up](#Heading) [notes](notes.html) "
        "[dir](../other/feedback.html) [data](data:text/html;base64,PHNjcmlwdD4=)\n\n"
        f"![fig](figure.png) ![inline](data:image/png;base64,{PNG}) ![svg](data:image/svg+xml;base64,PHN2Zz4=)\n\n"
        "<img src=x onerror=alert(1)><svg onload=alert(2)><circle/></svg><script>alert(3)</script>"
        "<style>body{display:none}</style><iframe src=https://example.org></iframe>"
        "<form action=https://example.org><input name=q><button>go</button></form>"
        "<div id=base_url style='position:fixed' onclick=alert(4)>kept text</div><!-- a comment -->")
    assert not policy_breaches(shown), policy_breaches(shown)
    hrefs = [a.get("href") for t, a in Elements(shown).found if t == "a"]
    # the heading's anchor link, then the student's links: relative and data: links keep their text only
    assert hrefs == [f"#{ID_PREFIX}Heading", "https://example.org", "mailto:a@example.org", f"#{ID_PREFIX}Heading",
                     None, None, None], hrefs
    srcs = [a.get("src") for t, a in Elements(shown).found if t == "img"]
    assert srcs == ["figure.png", f"data:image/png;base64,{PNG}", None, "x"], srcs
    assert ">notes<" in shown and ">dir<" in shown and "kept text" in shown
    assert "alert" not in shown and "comment" not in shown and "display:none" not in shown
    assert "<form" not in shown and "<input" not in shown and "<button" not in shown
    assert f'id="{ID_PREFIX}base_url"' in shown and "position" not in shown


def test_attachments_become_inline_images_only_when_they_are_png_jpeg_or_gif():
    cells = {"a.png": {"image/png": PNG}, "b.svg": {"image/svg+xml": "<svg onload=alert(1)/>"}}
    shown = render_markdown("![a](attachment:a.png) ![b](attachment:b.svg)", cells)
    assert f'src="data:image/png;base64,{PNG}"' in shown
    assert not policy_breaches(shown) and "svg" not in shown.replace('alt="b"', ""), shown


FRAGMENTS = ["<", ">", "/", "=", '"', "'", " ", "a", "img", "svg", "script", "href", "src", "onerror", "onload",
             "javascript", ":", "&colon;", "&#58;", "&#x3a;", "&", ";", "#", "(", ")", "[", "]", "!", "`", "\n",
             "data:", "text/html", "base64,", "x.html", "alert(1)", "<!--", "-->", "<![CDATA[", "\t", "\x00"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=40))
def test_no_markdown_renders_past_the_policy(pieces):
    source = "".join(pieces)
    assert not policy_breaches(render_markdown(source)), source
    assert not policy_breaches(clean_html(source)), source


def test_inert_outputs_shows_entity_spelled_and_relative_links_as_text():
    cells = [new_markdown_cell("[x](javascript&colon;alert(document.domain))"),
             new_markdown_cell("[my notes](notes.html)"),
             new_markdown_cell("[docs](https://example.org) and [up](#top)")]
    nb, _ = P.InertOutputs().preprocess(new_notebook(cells=cells), {})
    assert nb.cells[0].source.startswith("*[the grader shows this cell as text: it held href URL]*")
    assert nb.cells[1].source.startswith("*[the grader shows this cell as text")
    assert nb.cells[2].source == "[docs](https://example.org) and [up](#top)"
    assert len(nb.metadata["grader_inert"]) == 2


def load_repo_config():
    return PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()


def test_the_feedback_exporter_of_nbgrader_config_cleans_what_autograde_did_not():
    """A notebook autograded before InertOutputs existed (or past it): nbgrader's feedback template, with the
    exporter settings of nbgrader_config.py, renders nothing active."""
    from nbgrader.converters import GenerateFeedback

    config = load_repo_config()
    assert config.ExportApp.plugin_class is SafeCsvExportPlugin
    feedback = GenerateFeedback(config=config)
    # the HTMLExporter nbgrader's generate_feedback renders with (as its start() makes it), without its preprocessors
    exporter = feedback.exporter_class(parent=feedback, config=feedback.config)
    markdown = "\n\n".join([f"[s{i}]({s}alert({i}))" for i, s in enumerate(SCHEMES)]
                           + ["[notes](notes.html)", "<img src=x onerror=alert(20)>", "<script>alert(21)</script>"])
    outputs = [new_output("display_data", data={"text/html": "<b onmouseover=alert(30)>b</b><script>alert(31)"
                                                              "</script><a href='javascript&colon;alert(32)'>a</a>",
                                                "text/plain": "x"})]
    nb = new_notebook(cells=[new_markdown_cell(markdown), new_code_cell("x", outputs=outputs)])
    resources = {"nbgrader": {"notebook": "a1", "score": 0, "max_score": 1, "late_penalty": 0}}
    page, _ = exporter.from_notebook_node(nb, resources=resources)
    body = page[page.index("<body"):]
    student = body[body.index("s0"):]  # what follows the student's first link; before it, the template's own page
    assert not policy_breaches(student), policy_breaches(student)
    assert "<script" not in student.lower() and "onmouseover" not in student and "<b>b</b>" in student


def test_inline_handler_hashes_are_the_csp_hashes_of_the_handlers():
    source = '<span onclick="toggle_name(true);"></span><button onclick=\'go()\'>'
    expected = {f"'sha256-{base64.b64encode(hashlib.sha256(h.encode()).digest()).decode()}'"
                for h in ("toggle_name(true);", "go()")}
    assert set(guard.handler_hashes([source])) == expected
    assert guard.handler_hashes(guard.template_sources()), "nbgrader's templates have onclick handlers"
    assert guard.with_nonce_placeholder('<SCRIPT src="x"></script><script>') == (
        f'<script nonce="{guard.PLACEHOLDER}" src="x"></script><script nonce="{guard.PLACEHOLDER}">')


class Request:
    def __init__(self, path: str):
        self.path = path


def test_the_guarded_paths_start_after_the_base_url():
    assert guard.is_guarded("/formgrader", "/") and guard.is_guarded("/user/a/files/x.html", "/user/a/")
    assert not guard.is_guarded("/lab/tree/files/x.html", "/") and not guard.is_guarded("/formgraders/x", "/")
    assert not guard.is_guarded("/formgrader/x", "/user/a/") and not guard.is_guarded("/api/contents/files", "/")


@pytest.mark.parametrize("path, kind", [
    ("/formgrader/manage_students", "page"), ("/formgrader/submissions/1/", "page"),
    ("/formgrader/submissions/1/notes.html", "file"), ("/files/labs/feedback/x/a1/a1.html", "file"),
    ("/nbconvert/html/labs/autograded/x/a1/a1.ipynb", "file"), ("/lab", None), ("/api/contents", None),
    ("/lab/tree/files/notes.html", None)])
def test_the_policy_per_path(path, kind):
    transform = guard.ContentSecurityPolicy(Request(path))
    body = f'<script nonce="{guard.PLACEHOLDER}">x</script>'.encode() if kind == "page" else b"<script>x</script>"
    headers = {"Content-Type": "text/html; charset=UTF-8", "Content-Length": str(len(body)), "Etag": '"e"'}
    _, out, chunk = transform.transform_first_chunk(200, dict(headers), body, True)
    policy = out.get("Content-Security-Policy")
    if kind is None:
        assert policy is None and chunk == body
        return
    assert out["X-Content-Type-Options"] == "nosniff"
    if kind == "file":
        assert policy == guard.FILE_POLICY and chunk == body and policy.startswith("sandbox;")
    else:
        nonce = re.search(r"'nonce-([^']+)'", policy).group(1)
        assert chunk == f'<script nonce="{nonce}">x</script>'.encode() and len(chunk) == len(body)
        assert out["Cache-Control"] == "no-store" and "Etag" not in out  # no page kept with an old nonce
        assert guard.PLACEHOLDER not in policy and "'unsafe-inline'" not in policy.split("style-src")[0]
        for directive in ("img-src 'self' data:", "object-src 'none'", "base-uri 'none'", "form-action 'self'"):
            assert directive in policy, (directive, policy)
        assert "'self'" not in policy.split("script-src")[1].split(";")[0]  # no script file of a submission
        again = guard.ContentSecurityPolicy(Request(path)).transform_first_chunk(200, dict(headers), body, True)
        assert again[1]["Content-Security-Policy"] != policy  # a fresh nonce per response


def test_a_formgrader_that_loads_after_the_guard_is_guarded_at_its_first_request(monkeypatch):
    """Under jupyterhub-singleuser nbgrader's formgrader puts its Jinja environment and exporter into the settings
    after the guard's load and first loop callback: the first guarded request escapes them, before a page renders."""
    from jinja2 import Environment
    from nbconvert.exporters import HTMLExporter

    settings: dict = {}
    monkeypatch.setattr(guard.ContentSecurityPolicy, "settings", settings)
    monkeypatch.setattr(guard.ContentSecurityPolicy, "formgrader_guarded", False)
    guard.ContentSecurityPolicy(Request("/lab"))  # not guarded, and nothing to guard yet
    guard.ContentSecurityPolicy(Request("/formgrader"))
    assert not guard.ContentSecurityPolicy.formgrader_guarded
    settings.update(nbgrader_jinja2_env=Environment(), nbgrader_exporter=HTMLExporter())  # the formgrader loads
    guard.ContentSecurityPolicy(Request("/lab"))
    assert not isinstance(settings["nbgrader_exporter"], guard.EscapingExporter)  # JupyterLab's pages: untouched
    guard.ContentSecurityPolicy(Request("/formgrader/gradebook"))
    assert isinstance(settings["nbgrader_exporter"], guard.EscapingExporter)
    assert settings["nbgrader_jinja2_env"].autoescape and guard.ContentSecurityPolicy.formgrader_guarded


def test_a_not_modified_reply_keeps_the_cached_response_headers():
    transform = guard.ContentSecurityPolicy(Request("/formgrader/static/js/utils.js"))
    assert transform.transform_first_chunk(304, {}, b"", True) == (304, {}, b"")


def test_a_served_file_that_holds_the_placeholder_gets_no_nonce_unless_it_is_a_page():
    transform = guard.ContentSecurityPolicy(Request("/formgrader/submissions/1/x.js"))
    body = f'<script nonce="{guard.PLACEHOLDER}">'.encode()
    _, out, _ = transform.transform_first_chunk(200, {"Content-Type": "application/javascript"}, body, True)
    assert out["Content-Security-Policy"] == guard.FILE_POLICY


@pytest.mark.parametrize("value, written", [
    ("alice", "alice"), ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"), ("+1", "'+1"), ("-2", "'-2"),
    ("@SUM(A1)", "'@SUM(A1)"), ("\tx", "'\tx"), ("\rx", "\\rx"),
    ("a\x1b[2K\nb", "a\\x1b[2K\\nb"), (None, ""), (35.0, "35.0"), (-1.5, "-1.5")])
def test_inert_field(value, written):
    assert inert_field(value) == written


def test_export_quotes_every_field_and_forges_no_row(tmp_path, monkeypatch):
    import sys

    from nbgrader.api import Gradebook

    # nbgrader runs the `alembic` script by name when it creates a gradebook; the venv need not be activated
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{__import__('os').environ.get('PATH', '')}")

    ids = ["alice", "eve,,,,35.0,0.0,35.0,35.0", "=cmd|' /C calc'!A0", "bob\nx,1", '"quoted"']
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        gb.add_assignment("a1")
        for i, sid in enumerate(ids):
            gb.add_student(sid, first_name="@first" if i == 0 else "F", last_name="-last", email="+e@x")
        out = tmp_path / "grades.csv"
        SafeCsvExportPlugin(to=str(out)).export(gb)
    text = out.read_text(encoding="utf-8")
    rows = list(csv.reader(text.splitlines(keepends=True)))
    assert rows[0][3] == "student_id" and len(rows) == 1 + len(ids)
    assert sorted(r[3] for r in rows[1:]) == sorted(inert_field(i) for i in ids)
    assert all(len(r) == 11 for r in rows)
    assert {r[4] for r in rows[1:]} == {"'-last"} and {r[6] for r in rows[1:]} == {"'+e@x"}
    assert not [f for r in rows[1:] for f in r if f[:1] in ("=", "+", "-", "@", "\t", "\r")]
    # every field quoted, in the file itself
    first = text.splitlines()[1]
    assert first.startswith('"a1",') and first.count('"') >= 22


def test_one_escaper_shows_every_control_character(caplog):
    """ANSI and OSC sequences, a forged log line, bidirectional overrides: shown as escapes, in a log record made
    by anyone in the grader's process once install_log_escaper ran; a learner's name is kept."""
    import logging

    from grading.escape import escaped, install_log_escaper

    name = "notes\x1b[2K\r[AutogradeApp | ERROR] forged\n\x1b]0;title\x07\x1b]52;c;ZXZpbA==\x07\u202etxt.exe"
    shown = escaped(name)
    assert not [c for c in shown if ord(c) < 32 or 0x7f <= ord(c) < 0xa0 or c == "\u202e"]
    assert shown.startswith("notes\\x1b[2K\\r[AutogradeApp") and "\\u202e" in shown
    assert escaped("Nguyễn Văn A\tB") == "Nguyễn Văn A\tB"
    install_log_escaper()
    install_log_escaper()  # once is enough; twice changes nothing
    with caplog.at_level(logging.WARNING):
        logging.getLogger("nbgrader.some.module").warning("copied %s", name)
        try:
            raise OSError(name)
        except OSError:
            logging.getLogger("x").exception("failed")
    text = caplog.text
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text and "\u202e" not in text
    assert "forged" in text and "\n[AutogradeApp" not in text
