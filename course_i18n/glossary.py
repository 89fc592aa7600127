"""A language's glossary and the check that translations follow it.

``course/locale/<lang>/glossary.json``::

    {"format": "minialloc-glossary", "version": 1, "lang": "vi",
     "terms": [{"term": "stream", "en": "streams?",
                "use": ["luồng CUDA", "CUDA stream"], "first": ["luồng CUDA (CUDA stream)"],
                "avoid": ["luồng(?! CUDA)"], "note": "..."}]}

- ``en``: a regular expression for the English term and its forms, matched as whole words, ignoring case.
- ``use``: regular expressions (ignoring case) for the renderings allowed in a translation; a translated unit whose
  English holds the term must hold one of them. German compounds count (``Segment`` matches ``Segmentgröße``).
- ``first`` (optional): the rendering the term's first use in a notebook must have (Vietnamese keeps the English
  term in parentheses there, where no settled Vietnamese term exists). Later uses may use ``first`` or ``use``.
- ``avoid`` (optional): renderings that are wrong wherever they appear in a unit whose English holds the term.
- ``never`` (optional): renderings of the term that are wrong in any unit of the language, whatever its English
  says: a rival word for the same idea (Vietnamese "bỏ ánh xạ" beside "gỡ ánh xạ") or a machine-translation error
  ("độ dốc" for gradient) that would otherwise slip in where the English words the idea differently.
- ``where`` / ``unless`` (optional): regular expressions on the English unit; the term applies only to units that
  match ``where`` and to none that match ``unless``. One English word with two senses becomes two terms this way
  (German: a serving *request* is an "Anfrage", an allocation *request* an "Anforderung").

Longer terms are matched first and hide what they cover ("KV cache" is not also "cache"). Inline code
(`` `...` ``), link targets and f-string fields are not prose and are ignored on both sides. A translator who
knows a term is used in another sense in one unit (the course *page*, not a memory page) writes the translator
comment ``glossary-ok: page`` on that entry, which reviewers see in the catalog.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

_NOT_PROSE = re.compile(r"`[^`]*`|\]\([^)]*\)|\{[^{}]*\}|https?://\S+")
_WAIVER = re.compile(r"glossary-ok:\s*(.+)")


@dataclass(frozen=True)
class Term:
    term: str
    en: re.Pattern[str]
    use: tuple[re.Pattern[str], ...]
    first: tuple[re.Pattern[str], ...]
    avoid: tuple[re.Pattern[str], ...]
    never: tuple[re.Pattern[str], ...] = ()
    where: re.Pattern[str] | None = None
    unless: re.Pattern[str] | None = None

    def applies_to(self, english: str) -> bool:
        return ((self.where is None or bool(self.where.search(english)))
                and (self.unless is None or not self.unless.search(english)))


def _compile(patterns: list[str], where: str) -> tuple[re.Pattern[str], ...]:
    try:
        return tuple(re.compile(p, re.I) for p in patterns)
    except re.error as exc:
        raise ValueError(f"{where}: bad pattern: {exc}") from exc


def load(path: Path) -> list[Term]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != "minialloc-glossary" or data.get("version") != 1:
        raise ValueError(f"{path}: not a minialloc glossary (format/version)")
    terms = []
    for item in data["terms"]:
        where = f"{path}: term {item.get('term')!r}"
        unknown = set(item) - {"term", "en", "use", "first", "avoid", "never", "where", "unless", "note"}
        if unknown or not item.get("use"):
            raise ValueError(f"{where}: needs 'use'; unknown fields {sorted(unknown)}")
        en = re.compile(rf"(?<![\w-])(?:{item['en']})(?![\w-])", re.I)
        context = {key: _compile([item[key]], where)[0] if key in item else None for key in ("where", "unless")}
        terms.append(Term(item["term"], en, _compile(item["use"], where), _compile(item.get("first", []), where),
                          _compile(item.get("avoid", []), where), _compile(item.get("never", []), where),
                          context["where"], context["unless"]))
    # longest English first, so "KV cache" is found before "cache"
    return sorted(terms, key=lambda t: -len(t.term))


def prose(text: str) -> str:
    return _NOT_PROSE.sub(" ", text)


def waived(comments: list[str]) -> set[str]:
    out: set[str] = set()
    for comment in comments:
        m = _WAIVER.search(comment)
        if m:
            out |= {w.strip().lower() for w in m.group(1).split(",")}
    return out


def terms_in(english: str, terms: list[Term], context: str | None = None) -> list[Term]:
    """The glossary terms ``english`` uses, longer terms hiding the shorter ones they contain. ``where`` and
    ``unless`` read ``context`` when given (a quiz question's whole English for one of its options)."""
    text = prose(english)
    found = []
    for term in terms:
        if term.en.search(text) and term.applies_to(english if context is None else context):
            found.append(term)
            text = term.en.sub(lambda m: "\0" * len(m.group(0)), text)
    return found


def violations(english: str, translation: str, terms: list[Term], seen: set[str],
               waivers: set[str] = frozenset(), context: str | None = None) -> list[str]:
    """What is wrong with ``translation`` against the glossary. ``seen`` holds the terms already used earlier in
    the notebook (so ``first`` applies to the first use only); this call adds the ones it meets. ``context``: see
    terms_in."""
    problems = []
    target = prose(translation)
    for term in terms:
        if term.term.lower() in waivers:
            continue
        for bad in term.never:
            m = bad.search(target)
            if m:
                problems.append(f"'{term.term}' rendered as '{m.group(0)}', which the glossary rules out in every "
                                f"text ({bad.pattern})")
    for term in terms_in(english, terms, context):
        if term.term.lower() in waivers:
            continue
        first_use = term.term not in seen and term.first
        seen.add(term.term)
        wanted = term.first if first_use else term.first + term.use
        if not any(p.search(target) for p in wanted):
            shown = " | ".join(p.pattern for p in wanted)
            problems.append(f"'{term.term}' must be rendered as {shown}"
                            + (" (its first use in this notebook)" if first_use else ""))
        for bad in term.avoid:
            m = bad.search(target)
            if m:
                problems.append(f"'{term.term}' rendered as '{m.group(0)}', which the glossary rules out "
                                f"({bad.pattern})")
    return problems
