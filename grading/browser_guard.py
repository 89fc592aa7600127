"""A Jupyter Server extension for the JupyterLab that grades: nbgrader's formgrader runs none of the students' script.

`make grade` and `make grade-quiz` load it (`--ServerApp.jpserver_extensions=grading.browser_guard=True`).
It does four things, each independent of the others:

1. A Content-Security-Policy on every response under `formgrader/`, `files/` and `nbconvert/`. The formgrader's
   own pages (its templates hold inline scripts and onclick handlers) get a policy that allows script tags carrying
   this response's nonce and the templates' own event handlers (by hash, 'unsafe-hashes'), and nothing else: no
   other script tag or file, no other event handler attribute, no javascript: URL. Every other response there (a
   file of a submission the formgrader serves from the autograded folder, a feedback or notebook file JupyterLab
   serves, an nbconvert export) gets `sandbox` with no script at all.
   How the nonce gets there: the templates' source (nbgrader's and nbconvert's, never what a student wrote) has a
   per-process secret placeholder put into each `<script` tag as the loader reads it; an output transform swaps it
   for a fresh random nonce per response and sends the policy with it.
2. The formgrader's own pages (manage students, gradebook...) are rendered with Jinja's autoescape: nbgrader 0.9
   prints the student id from the URL and other names unescaped.
3. The formgrader's notebook page (formgrade): the student id, names and the notebook's and assignment's names are
   escaped before nbgrader's template prints them raw, and markdown cells and HTML outputs go through the
   allow-list sanitizer (grading/sanitize.py), as the feedback does.
4. That page is rendered off the server's event loop, one at a time, within RENDER_TIMEOUT_S
   (guard_submission_page): other requests are answered while a big notebook renders.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import os
import re
import secrets
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from jinja2 import BaseLoader, Environment, FileSystemLoader
from tornado.ioloop import IOLoop
from tornado.web import OutputTransform

from . import sanitize

# 32 characters, the length of every nonce: the response's length does not change when one replaces it
PLACEHOLDER = secrets.token_urlsafe(24)
GUARDED = ("formgrader", "files", "nbconvert")  # the first part of a path, after the server's base URL
SCRIPT_TAG = re.compile(r"<script\b", re.I)
INLINE_HANDLER = re.compile(r"""\son[a-z]+\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.I)
# what a served file may do: show text, images and styles; no script, no plugin, no form, an origin of its own
FILE_POLICY = ("sandbox; default-src 'none'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
               "font-src 'self' data:; frame-ancestors 'self'")


def with_nonce_placeholder(source: str) -> str:
    """A template's source with the placeholder nonce on each of its script tags."""
    return SCRIPT_TAG.sub(f'<script nonce="{PLACEHOLDER}"', source)


def handler_hashes(sources: Iterable[str]) -> list[str]:
    """CSP hash sources ('sha256-...') of the inline event handlers written in these templates."""
    found = {double or single for s in sources for double, single in INLINE_HANDLER.findall(s)}
    return sorted(f"'sha256-{base64.b64encode(hashlib.sha256(h.encode()).digest()).decode()}'" for h in found)


def page_policy(nonce: str, hashes: Iterable[str]) -> str:
    """The formgrader pages' policy: only script tags carrying the nonce (every script tag of the templates, files
    of the server included; not a script file of a submission, which the formgrader serves from the same origin) and
    the templates' own event handlers."""
    scripts = " ".join([f"'nonce-{nonce}'", *(["'unsafe-hashes'", *hashes] if hashes else [])])
    return (f"default-src 'self'; script-src {scripts}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "font-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
            "frame-ancestors 'self'")


class NonceLoader(BaseLoader):
    """Another loader's templates, with the placeholder nonce on their script tags."""

    def __init__(self, inner: BaseLoader):
        self.inner = inner

    def get_source(self, environment, template):
        source, filename, uptodate = self.inner.get_source(environment, template)
        return with_nonce_placeholder(source), filename, uptodate

    def list_templates(self):
        return self.inner.list_templates()


def is_guarded(path: str, base_url: str = "/") -> bool:
    """Whether a request path is one the policy covers (not JupyterLab's own pages, whatever their folders' names)."""
    if not path.startswith(base_url):
        return False
    return path[len(base_url):].split("/", 1)[0] in GUARDED


class ContentSecurityPolicy(OutputTransform):
    """Tornado output transform: the policy on guarded paths, the nonce swapped into the page."""

    hashes: list[str] = []
    base_url = "/"  # the server's (ServerApp.base_url), set when the extension loads
    # The web app's settings, set when the extension loads. Under jupyterhub-singleuser (a hub's grading service)
    # nbgrader's formgrader loads after this extension and after its first loop callback, so the formgrader is
    # guarded again at each guarded request until it is: before any of its pages renders.
    settings: dict | None = None
    formgrader_guarded = False

    def __init__(self, request):
        super().__init__(request)
        self.guarded = is_guarded(request.path or "", self.base_url)
        if self.guarded and not ContentSecurityPolicy.formgrader_guarded and self.settings is not None:
            ContentSecurityPolicy.formgrader_guarded = guard_formgrader(self.settings)

    def transform_first_chunk(self, status_code, headers, chunk, finishing):
        if not self.guarded or status_code == 304:  # a 304's headers would replace those of the cached response
            return status_code, headers, chunk
        marker = PLACEHOLDER.encode()
        if marker in chunk and headers.get("Content-Type", "").startswith("text/html"):
            nonce = secrets.token_urlsafe(24)
            chunk = chunk.replace(marker, nonce.encode())
            headers["Content-Security-Policy"] = page_policy(nonce, self.hashes)
            # never reused: tornado's Etag is of the page before the nonce, and a page revalidated from the
            # browser's cache would keep an old nonce
            headers.pop("Etag", None)
            headers["Cache-Control"] = "no-store"
        else:
            headers["Content-Security-Policy"] = FILE_POLICY
        headers["X-Content-Type-Options"] = "nosniff"
        return status_code, headers, chunk


class EscapingExporter:
    """The formgrader's HTMLExporter, given the student's names escaped: nbgrader's formgrade template prints
    resources.student, first_name, last_name, notebook_id and assignment_id as they are."""

    def __init__(self, exporter):
        self.exporter = exporter

    def from_filename(self, filename, resources=None, **kw):
        resources = {k: sanitize.escape_text(v) if isinstance(v, str) and k != "base_url" else v
                     for k, v in (resources or {}).items()}
        return self.exporter.from_filename(filename, resources=resources, **kw)

    def __getattr__(self, name):
        return getattr(self.exporter, name)


def guard_formgrader(settings: dict) -> bool:
    """Put autoescape, the nonce loader and the sanitizer into the formgrader's settings (False: not loaded)."""
    env, exporter = settings.get("nbgrader_jinja2_env"), settings.get("nbgrader_exporter")
    if env is None or exporter is None or isinstance(exporter, EscapingExporter):
        return isinstance(exporter, EscapingExporter)
    from nbgrader.server_extensions.formgrader.handlers import template_path

    settings["nbgrader_jinja2_env"] = Environment(loader=NonceLoader(FileSystemLoader([template_path])),
                                                  autoescape=True)
    exporter.sanitize_html = True  # the classic template cleans text/html outputs with clean_html
    exporter.environment.loader = NonceLoader(exporter.environment.loader)
    exporter.register_filter("markdown2html", sanitize.markdown2html)
    exporter.register_filter("clean_html", sanitize.clean_html)
    settings["nbgrader_exporter"] = EscapingExporter(exporter)
    return True


# The formgrader's notebook page is rendered (nbconvert, Pygments highlighting every code cell) off the server's
# event loop, one page at a time, within RENDER_TIMEOUT_S: nbgrader renders it inside the request handler, in the
# loop every request of that JupyterLab waits on (1.5 MB of `x = 1` in a code cell held every request 260 s).
RENDER_TIMEOUT_S = 60.0
_render_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="formgrade-render")


async def render_off_the_loop(exporter, filename: str, resources: dict, timeout: float = RENDER_TIMEOUT_S) -> str:
    """The page `exporter.from_filename` makes, rendered in the render thread; TimeoutError past `timeout` (the
    thread finishes that page in the background; the next page waits for it)."""
    loop = asyncio.get_running_loop()
    job = loop.run_in_executor(_render_pool, functools.partial(exporter.from_filename, filename, resources=resources))
    html, _ = await asyncio.wait_for(job, timeout)
    return html


def guard_submission_page() -> None:
    """nbgrader's formgrade page handler (SubmissionHandler.get), with the rendering off the event loop."""
    from nbgrader.server_extensions.formgrader import handlers
    from nbgrader.server_extensions.formgrader.base import check_notebook_dir, check_xsrf
    from tornado import web

    if getattr(handlers.SubmissionHandler.get, "off_the_loop", False):
        return

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    async def get(self, submission_id):  # nbgrader 0.9.6's SubmissionHandler.get, the exporter call awaited
        try:
            submission = self.gradebook.find_submission_notebook_by_id(submission_id)
            assignment_id = submission.assignment.assignment.name
            notebook_id = submission.notebook.name
            student_id = submission.student.id
        except handlers.MissingEntry:
            raise web.HTTPError(404, "Invalid submission") from None
        if os.path.split(self.request.path)[1] == submission_id:
            url = self.request.path + "/" + ("?" + self.request.query if self.request.query else "")
            return self.redirect(url, permanent=True)
        filename = os.path.join(os.path.abspath(self.coursedir.format_path(
            self.coursedir.autograded_directory, student_id, assignment_id)), f"{notebook_id}.ipynb")
        relative_path = os.path.relpath(filename, self.coursedir.root)
        indices = self.api.get_notebook_submission_indices(assignment_id, notebook_id)
        resources = {
            "assignment_id": assignment_id, "notebook_id": notebook_id, "submission_id": submission.id,
            "index": indices.get(submission.id, -2), "total": len(indices), "base_url": self.base_url,
            "student": student_id, "last_name": submission.student.last_name,
            "first_name": submission.student.first_name, "notebook_path": self.url_prefix + "/" + relative_path,
        }
        if not os.path.exists(filename):
            resources["filename"] = filename
            html = self.render("formgrade_404.tpl", resources=resources)
            self.clear()
            self.set_status(404)
            self.write(html)
            return
        try:
            html = await render_off_the_loop(self.exporter, filename, resources)
        except TimeoutError:
            raise web.HTTPError(503, f"this notebook took more than {RENDER_TIMEOUT_S:g} s to render") from None
        self.write(html)

    get.off_the_loop = True
    handlers.SubmissionHandler.get = get


def template_sources() -> list[str]:
    """The source of every formgrader template (where the inline handlers are)."""
    from nbgrader.server_extensions.formgrader.handlers import template_path

    sources = []
    for folder, _, files in os.walk(template_path):
        for name in files:
            if name.endswith((".tpl", ".j2", ".html")):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    sources.append(f.read())
    return sources


def _jupyter_server_extension_points():
    return [{"module": "grading.browser_guard"}]


def _load_jupyter_server_extension(serverapp) -> None:
    webapp = serverapp.web_app
    ContentSecurityPolicy.hashes = handler_hashes(template_sources())
    ContentSecurityPolicy.base_url = webapp.settings.get("base_url") or "/"
    ContentSecurityPolicy.settings, ContentSecurityPolicy.formgrader_guarded = webapp.settings, False
    webapp.transforms.insert(0, ContentSecurityPolicy)  # before compression: it reads and edits the page

    def guard() -> None:  # nbgrader's formgrader extension may load after this one: guard once all are loaded
        if guard_formgrader(webapp.settings):
            ContentSecurityPolicy.formgrader_guarded = True
        else:  # not yet: the first request under formgrader/ guards it (ContentSecurityPolicy.__init__)
            serverapp.log.info("browser_guard: nbgrader's formgrader is not loaded yet; guarded at its first request")

    guard_formgrader(webapp.settings)
    guard_submission_page()
    IOLoop.current().add_callback(guard)
    serverapp.log.info("browser_guard: Content-Security-Policy on formgrader/, files/ and nbconvert/")
