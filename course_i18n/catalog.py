"""The gettext catalogs: one ``.po`` file per language per notebook, read and written with Babel.

Each message is one unit of the English notebook (see segments.py): ``msgctxt`` is the cell id, or
``"<cell id>:<n>"`` when the cell has several units (n counts from 1 in the cell's order), ``msgid`` the English
text, and an extracted comment (``#.``) says what kind of text it is. Updating a catalog after an English change
(``merge``) keeps a translator's work wherever the English still says the same thing:

- same cell, same English: kept as it was (a fuzzy entry stays fuzzy);
- same English elsewhere in the same cell (a paragraph was inserted before it): kept, under its new key;
- same English in another cell, or an old entry: its translation is offered, marked fuzzy;
- English changed: the most similar old unit of the same cell gives its translation, marked fuzzy, with the old
  English kept as ``#| msgid`` so the translator sees what changed;
- anything else is new and untranslated; old entries nobody took become obsolete (``#~``).
"""

from __future__ import annotations

import difflib
import io
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from babel.messages.catalog import Catalog, Message
from babel.messages.pofile import read_po, unescape, write_po

PROJECT = "minialloc course"
SIMILAR = 0.5  # below this similarity an old translation is not worth offering for a changed paragraph
AUTO_FLAGS = ("python-format", "python-brace-format")  # Babel guesses these from % and {}; prose is neither


@dataclass(frozen=True)
class Entry:
    """One unit of an English notebook, as the catalog keys it."""

    context: str
    text: str
    kind: str

    @property
    def cell(self) -> str:
        return cell_of(self.context)


def cell_of(context: str | None) -> str:
    return (context or "").split(":", 1)[0]


def read(path: Path) -> Catalog:
    with path.open("rb") as f:
        catalog = read_po(f, abort_invalid=True)
    # Babel writes the previous English (``#| msgid``) but does not read it back: keep it across updates.
    for context, previous in _previous_ids(path.read_text(encoding="utf-8")).items():
        for message in messages(catalog):
            if message.context == context and message.fuzzy:
                message.previous_id = [previous]
    return catalog


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _previous_ids(text: str) -> dict[str, str]:
    """msgctxt -> the ``#| msgid`` written above it. Babel wraps that comment at spaces, even inside its quoted
    pieces, so the lines are joined with one space again before the pieces are read."""
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in text.splitlines():
        if line.startswith("#| "):
            pending.append(line[3:])
        elif line.startswith("msgctxt ") and pending:
            joined = " ".join(pending)
            if joined.startswith("msgid "):
                context = unescape(line[len("msgctxt "):].strip())
                found[context] = "".join(unescape(f'"{piece}"') for piece in _QUOTED.findall(joined[6:]))
            pending = []
        elif not line.startswith("#"):
            pending = []
    return found


def write(path: Path, catalog: Catalog) -> bool:
    """Write ``catalog`` to ``path`` when its text changed; True when the file was written."""
    buf = io.BytesIO()
    write_po(buf, catalog, width=116, include_previous=True, sort_output=False)
    data = buf.getvalue()
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True


def new_catalog(lang: str, notebook: str, old: Catalog | None = None, what: str = "course notebook") -> Catalog:
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    catalog = Catalog(locale=lang, project=PROJECT, version="1", fuzzy=False,
                      creation_date=old.creation_date if old is not None else now,
                      revision_date=old.revision_date if old is not None else now,
                      last_translator=old.last_translator if old is not None else "",
                      language_team=old.language_team if old is not None else "")
    catalog.header_comment = (f"# {notebook}: {lang} translation of the {what}.\n"
                              "# Updated by `python -m course_i18n extract`; the English notebook is the source.")
    return catalog


def translated(message: Message) -> bool:
    return bool(message.string) and not message.fuzzy


def messages(catalog: Catalog) -> list[Message]:
    """The catalog's live messages (not the header, not obsolete)."""
    return [m for m in catalog if m.id]


def _add(catalog: Catalog, entry: Entry, string: str, fuzzy: bool, previous: str | None,
         user_comments: list[str] | None = None) -> None:
    # the translator's own comments (e.g. a `glossary-ok:` waiver) belong to the translation: they travel with it
    message = catalog.add(entry.text, string, auto_comments=[entry.kind], user_comments=list(user_comments or ()),
                          context=entry.context, flags=("fuzzy",) if fuzzy else ())
    for flag in AUTO_FLAGS:
        message.flags.discard(flag)
    if previous is not None and previous != entry.text:
        message.previous_id = [previous]


def merge(entries: list[Entry], lang: str, notebook: str, old: Catalog | None, what: str = "course notebook"
          ) -> Catalog:
    """A catalog for ``entries`` (in notebook order) that keeps what ``old`` already holds (see the module doc)."""
    catalog = new_catalog(lang, notebook, old, what)
    live = messages(old) if old is not None else []
    gone = list(old.obsolete.values()) if old is not None else []
    used: set[int] = set()
    exact = {(m.context, m.id): k for k, m in enumerate(live)}
    chosen: dict[int, tuple[Message, bool]] = {}  # entry index -> (old message, fuzzy)

    def by_cell(cell: str) -> list[int]:
        return [k for k, m in enumerate(live) if k not in used and cell_of(m.context) == cell]

    for i, e in enumerate(entries):  # 1. same key, same English
        k = exact.get((e.context, e.text))
        if k is not None and k not in used:
            used.add(k)
            chosen[i] = (live[k], live[k].fuzzy)
    for i, e in enumerate(entries):  # 2. same English, same cell, new key
        if i in chosen:
            continue
        for k in by_cell(e.cell):
            if live[k].id == e.text:
                used.add(k)
                chosen[i] = (live[k], live[k].fuzzy)
                break
    for i, e in enumerate(entries):  # 3. English changed within the cell: the most similar old unit, fuzzy
        if i in chosen:
            continue
        scored = [(difflib.SequenceMatcher(None, live[k].id, e.text).ratio(), k) for k in by_cell(e.cell)]
        if scored:
            ratio, k = max(scored)
            if ratio >= SIMILAR:
                used.add(k)
                chosen[i] = (live[k], True)
    pool = [m for k, m in enumerate(live) if k not in used] + gone
    for i, e in enumerate(entries):  # 4. the same English anywhere else: offered, fuzzy
        if i in chosen:
            continue
        for m in pool:
            if m.id == e.text and m.string:
                chosen[i] = (m, True)
                break
    for i, e in enumerate(entries):
        if i in chosen:
            m, fuzzy = chosen[i]
            previous = m.previous_id[0] if (m.previous_id and m.id == e.text) else m.id
            fuzzy = fuzzy and bool(m.string)  # an empty translation is untranslated, never fuzzy
            _add(catalog, e, m.string, fuzzy, previous if fuzzy else None, m.user_comments)
        else:
            _add(catalog, e, "", False, None)
    keys = {(e.context, e.text) for e in entries}
    for k, m in enumerate(live):  # nobody took it: obsolete, kept for the translator
        if k not in used and (m.context, m.id) not in keys and m.string:
            catalog.obsolete[(m.id, m.context)] = _obsolete(m)
    for m in gone:
        key = (m.id, m.context)
        if key not in catalog.obsolete and (m.context, m.id) not in keys:
            catalog.obsolete[key] = m
    return catalog


def _obsolete(m: Message) -> Message:
    return Message(m.id, m.string, auto_comments=list(m.auto_comments), user_comments=list(m.user_comments),
                   flags=set(m.flags), context=m.context)
