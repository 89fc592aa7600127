"""The question bank: loading quizzes/bank/*.json and checking every entry against the schema in README.md.

Each file is one chapter's questions. Loading checks every field, and a bad entry raises BankError naming the
file, the question id and the field ("bank/ch2_fragmentation.json: question 'c2-oom-hint': field 'text.vi':
missing language 'vi'"), so an author can fix it without reading this code.

A Question is the bank entry as written. `question.render(seed)` gives a Rendered question: the text and
explanation with a computed question's parameters filled in, and the answer (for computed questions, the one
minialloc produced for that seed). The practice quiz calls render and never shows a Rendered answer in clear
(see quizzes.obfuscate). This public bank is for practice only: the graded quiz's questions and answers come from
an instructor's private bank (quizzes.graded), never from here.
"""

from __future__ import annotations

import functools
import json
import math
import re
import string
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import strict_json
from .computed import GENERATORS, generate
from .i18n import LANGS

BANK_DIR = Path(__file__).resolve().parent / "bank"
FORMAT = "minialloc-quiz-bank"
VERSION = 1
KINDS = ("single", "multi", "numeric", "computed")
ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")
OPTION_ID_RE = re.compile(r"^[a-z]$")

_FILE_KEYS = {"format", "version", "chapter", "title", "questions"}
_COMMON = {"id", "kind", "topic", "idea", "text", "explanation", "chapters", "tags"}
_KIND_KEYS = {
    "single": {"options", "answer", "exhibit"},
    "multi": {"options", "answer", "exhibit"},
    "numeric": {"answer", "tolerance", "unit", "misconceptions"},
    "computed": {"generator", "tolerance", "unit"},
}
_REQUIRED = {
    "single": {"options", "answer"},
    "multi": {"options", "answer"},
    "numeric": {"answer", "tolerance", "misconceptions"},
    "computed": {"generator", "tolerance", "unit"},
}

Text = dict[str, str]  # {"en": ..., "vi": ..., "de": ...}


class BankError(ValueError):
    """A malformed bank file or entry: names the file, the question id (if known) and the field."""

    def __init__(self, file: Path | str, qid: str | None, field: str | None, problem: str) -> None:
        self.file, self.qid, self.field, self.problem = str(file), qid, field, problem
        where = [self.file]
        if qid is not None:
            where.append(f"question {qid!r}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(": ".join(where + [problem]))


@dataclass(frozen=True)
class Option:
    id: str
    text: Text
    misconception: str | None = None  # a wrong option: the mistake a learner makes who picks it (English)


@dataclass(frozen=True)
class WrongRule:
    """A numeric question's wrong rule and the number it gives (which must differ from the answer)."""

    rule: str
    answer: float


@dataclass(frozen=True)
class Rendered:
    """A question ready to show: templates filled for one seed. Holds the answer: never show it as is."""

    qid: str
    kind: str
    text: Text
    explanation: Text
    options: tuple[Option, ...]
    unit: Text | None
    exhibit: str
    answer: str | frozenset[str] | float
    tolerance: float


@dataclass(frozen=True)
class Question:
    id: str
    kind: str
    topic: str
    idea: str  # the idea the question checks, in a sentence (for the bank's review, docs/quiz-review.md)
    chapters: tuple[int, ...]
    tags: tuple[str, ...]
    text: Text
    explanation: Text
    options: tuple[Option, ...]
    answer: str | frozenset[str] | float | None  # None for computed: minialloc gives it per seed
    tolerance: float
    unit: Text | None
    generator: str | None
    file: str
    exhibit: str = ""  # single/multi: a text to read (an OOM message, a snapshot excerpt), shown as it is
    misconceptions: tuple[WrongRule, ...] = ()  # numeric: the wrong rules and their numbers

    def render(self, seed: object = 0) -> Rendered:
        """The question for one seed (the seed matters only for computed questions)."""
        if self.kind != "computed":
            assert self.answer is not None
            return Rendered(self.id, self.kind, self.text, self.explanation, self.options, self.unit,
                            self.exhibit, self.answer, self.tolerance)
        assert self.generator is not None
        variant = generate(self.generator, f"{self.id}|{seed}")
        fill = {lang: _fill(self.text[lang], variant.params) for lang in LANGS}
        why = {lang: _fill(self.explanation[lang], variant.params) for lang in LANGS}
        return Rendered(self.id, self.kind, fill, why, (), self.unit, variant.exhibit, variant.answer, self.tolerance)


def _fill(template: str, params: Mapping[str, str]) -> str:
    return template.format_map(params)


class Bank:
    """Every question of every bank file, in file order; ids are unique across files."""

    def __init__(self, questions: Iterable[Question], titles: Mapping[int, Text]) -> None:
        self.questions: dict[str, Question] = {q.id: q for q in questions}
        self.titles = dict(titles)

    def __len__(self) -> int:
        return len(self.questions)

    def __iter__(self) -> Iterator[Question]:
        return iter(self.questions.values())

    def __getitem__(self, qid: str) -> Question:
        try:
            return self.questions[qid]
        except KeyError:
            raise KeyError(f"no question {qid!r} in the bank") from None

    def chapter(self, chapter: int | Sequence[int]) -> list[Question]:
        wanted = {chapter} if isinstance(chapter, int) else set(chapter)
        return [q for q in self if wanted & set(q.chapters)]

    @property
    def chapters(self) -> list[int]:
        return sorted({c for q in self for c in q.chapters})


def load_bank(paths: Iterable[Path | str] | None = None) -> Bank:
    """Load and check bank files (default: every quizzes/bank/*.json, sorted by name)."""
    files = sorted(BANK_DIR.glob("*.json")) if paths is None else [Path(p) for p in paths]
    if not files:
        raise BankError(BANK_DIR, None, None, "no bank files (*.json) found")
    try:
        stamp = tuple((str(f.resolve()), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    except OSError as e:
        raise BankError(getattr(e, "filename", BANK_DIR), None, None, f"cannot read: {e.strerror or e}") from None
    return _load_checked(stamp)


@functools.lru_cache(maxsize=8)
def _load_checked(stamp: tuple[tuple[str, int, int], ...]) -> Bank:
    """Checking runs every computed question's generator: do it once per version of the files."""
    files = [Path(path) for path, _, _ in stamp]
    questions: list[Question] = []
    seen: dict[str, str] = {}
    titles: dict[int, Text] = {}
    for path in files:
        chapter, title, entries = _load_file(path)
        titles[chapter] = title
        for q in entries:
            if q.id in seen:
                raise BankError(path, q.id, "id", f"duplicate id: already used in {seen[q.id]}")
            seen[q.id] = _display(path)
            questions.append(q)
    return Bank(questions, titles)


def _display(path: Path) -> str:
    """The path as messages show it: relative to the quizzes package when it lies inside it."""
    try:
        return str(path.resolve().relative_to(BANK_DIR.parent.parent))
    except ValueError:
        return str(path)


def _load_file(path: Path) -> tuple[int, Text, list[Question]]:
    name = _display(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BankError(name, None, None, f"cannot read: {e}") from None
    try:
        data = strict_json.loads(raw)
    except json.JSONDecodeError as e:
        raise BankError(name, None, None, f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except ValueError as e:
        raise BankError(name, None, None, str(e)) from None
    if not isinstance(data, dict):
        raise BankError(name, None, None, "the file must hold a JSON object with format, version, chapter, title, "
                                          "questions")
    _no_unknown_keys(data, _FILE_KEYS, name, None, "")
    if data.get("format") != FORMAT:
        raise BankError(name, None, "format", f"must be {FORMAT!r}")
    if data.get("version") != VERSION:
        raise BankError(name, None, "version", f"must be {VERSION}")
    chapter = data.get("chapter")
    if isinstance(chapter, bool) or not isinstance(chapter, int) or chapter < 0:
        raise BankError(name, None, "chapter", "must be a chapter number (an integer >= 0)")
    title = _text(data.get("title"), name, None, "title")
    entries = data.get("questions")
    if not isinstance(entries, list) or not entries:
        raise BankError(name, None, "questions", "must be a non-empty list of questions")
    return chapter, title, [_question(e, i, name, chapter) for i, e in enumerate(entries)]




def _no_unknown_keys(obj: Mapping[str, Any], allowed: set[str], file: str, qid: str | None, prefix: str) -> None:
    for key in obj:
        if key not in allowed:
            raise BankError(file, qid, f"{prefix}{key}", f"unknown field; allowed here: {', '.join(sorted(allowed))}")


def _text(value: Any, file: str, qid: str | None, field: str) -> Text:
    """A text in every language: exactly the keys of LANGS, each a non-empty string."""
    if not isinstance(value, dict):
        raise BankError(file, qid, field, f"must be an object with the languages {', '.join(LANGS)}")
    for lang in LANGS:
        if lang not in value:
            raise BankError(file, qid, f"{field}.{lang}", f"missing language {lang!r}")
        if not isinstance(value[lang], str) or not value[lang].strip():
            raise BankError(file, qid, f"{field}.{lang}", "must be a non-empty string")
    for lang in value:
        if lang not in LANGS:
            raise BankError(file, qid, f"{field}.{lang}", f"unknown language; use {', '.join(LANGS)}")
    return {lang: value[lang] for lang in LANGS}


def _number(value: Any, file: str, qid: str, field: str, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BankError(file, qid, field, "must be a finite number")
    if minimum is not None and value < minimum:
        raise BankError(file, qid, field, f"must be >= {minimum}")
    return float(value)


def _question(entry: Any, index: int, file: str, chapter: int) -> Question:
    if not isinstance(entry, dict):
        raise BankError(file, f"#{index + 1}", None, "a question must be a JSON object")
    qid = entry.get("id")
    if not isinstance(qid, str) or not ID_RE.match(qid):
        shown = qid if isinstance(qid, str) else f"#{index + 1}"
        raise BankError(file, shown, "id", "must be 2-63 characters of a-z, 0-9 and '-', starting with a letter "
                                           "or digit")
    kind = entry.get("kind")
    if kind not in KINDS:
        raise BankError(file, qid, "kind", f"must be one of {', '.join(KINDS)}")
    _no_unknown_keys(entry, _COMMON | _KIND_KEYS[kind], file, qid, "")
    for key in sorted(_REQUIRED[kind] | {"topic", "idea", "text", "explanation"}):
        if key not in entry:
            raise BankError(file, qid, key, f"missing (required for kind {kind!r})")
    topic = entry["topic"]
    if not isinstance(topic, str) or not topic.strip():
        raise BankError(file, qid, "topic", "must be a non-empty string")
    idea = entry["idea"]
    if not isinstance(idea, str) or not idea.strip():
        raise BankError(file, qid, "idea", "must be a non-empty string: the idea the question checks")
    chapters = entry.get("chapters", [chapter])
    if (not isinstance(chapters, list) or not chapters
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in chapters)):
        raise BankError(file, qid, "chapters", "must be a non-empty list of chapter numbers")
    tags = entry.get("tags", [])
    if not isinstance(tags, list) or any(not isinstance(t, str) or not t for t in tags):
        raise BankError(file, qid, "tags", "must be a list of non-empty strings")
    text = _text(entry["text"], file, qid, "text")
    explanation = _text(entry["explanation"], file, qid, "explanation")
    unit = _text(entry["unit"], file, qid, "unit") if "unit" in entry else None

    options: tuple[Option, ...] = ()
    answer: str | frozenset[str] | float | None = None
    tolerance = 0.0
    generator_name = None
    exhibit = ""
    wrong_rules: tuple[WrongRule, ...] = ()
    if kind in ("single", "multi"):
        options = _options(entry["options"], file, qid)
        ids = [o.id for o in options]
        answer = _choice_answer(kind, entry["answer"], ids, file, qid)
        _check_misconceptions(options, answer, file, qid)
        exhibit = entry.get("exhibit", "")
        if not isinstance(exhibit, str) or ("exhibit" in entry and not exhibit.strip()):
            raise BankError(file, qid, "exhibit", "must be a non-empty string (a message or excerpt to read)")
    elif kind == "numeric":
        answer = _number(entry["answer"], file, qid, "answer")
        tolerance = _number(entry["tolerance"], file, qid, "tolerance", minimum=0)
        wrong_rules = _wrong_rules(entry["misconceptions"], answer, tolerance, file, qid)
    else:
        generator_name = entry["generator"]
        if generator_name not in GENERATORS:
            raise BankError(file, qid, "generator",
                            f"unknown generator {generator_name!r}; known: {', '.join(sorted(GENERATORS))}")
        tolerance = _number(entry["tolerance"], file, qid, "tolerance", minimum=0)
        _check_templates(text, explanation, generator_name, file, qid)
    if kind != "computed":
        _check_no_placeholders(text, file, qid, "text")
        _check_no_placeholders(explanation, file, qid, "explanation")
    return Question(qid, kind, topic, idea, tuple(chapters), tuple(tags), text, explanation, options, answer,
                    tolerance, unit, generator_name, file, exhibit, wrong_rules)


def _check_misconceptions(options: tuple[Option, ...], answer: str | frozenset[str], file: str, qid: str) -> None:
    """Every wrong option names the misconception it stands for; a right one names none."""
    right = {answer} if isinstance(answer, str) else set(answer)
    for i, o in enumerate(options):
        if o.id in right and o.misconception is not None:
            raise BankError(file, qid, f"options[{i}].misconception", "a right option states no misconception")
        if o.id not in right and not o.misconception:
            raise BankError(file, qid, f"options[{i}].misconception",
                            "missing: name the mistake a learner makes who picks this wrong option")


def _wrong_rules(value: Any, answer: float, tolerance: float, file: str, qid: str) -> tuple[WrongRule, ...]:
    """A numeric question's wrong rules: each gives a number no other rule, nor the right one, gives."""
    if not isinstance(value, list) or not value:
        raise BankError(file, qid, "misconceptions", "must be a non-empty list of {\"rule\", \"answer\"}: the "
                                                     "wrong rules a learner applies and the numbers they give")
    rules: list[WrongRule] = []
    for i, item in enumerate(value):
        field = f"misconceptions[{i}]"
        if not isinstance(item, dict):
            raise BankError(file, qid, field, "must be an object with rule and answer")
        _no_unknown_keys(item, {"rule", "answer"}, file, qid, f"{field}.")
        rule = item.get("rule")
        if not isinstance(rule, str) or not rule.strip():
            raise BankError(file, qid, f"{field}.rule", "must be a non-empty string")
        number = _number(item.get("answer"), file, qid, f"{field}.answer")
        for other in [answer, *(r.answer for r in rules)]:
            if abs(number - other) <= tolerance:
                raise BankError(file, qid, f"{field}.answer", f"{number:g} is also what the right rule or another "
                                "wrong one gives: choose numbers that tell the rules apart")
        rules.append(WrongRule(rule, number))
    return tuple(rules)


def _options(value: Any, file: str, qid: str) -> tuple[Option, ...]:
    if not isinstance(value, list) or not 2 <= len(value) <= 6:
        raise BankError(file, qid, "options", "must be a list of 2 to 6 options")
    out: list[Option] = []
    for i, opt in enumerate(value):
        field = f"options[{i}]"
        if not isinstance(opt, dict):
            raise BankError(file, qid, field, "must be an object with id and text")
        _no_unknown_keys(opt, {"id", "text", "misconception"}, file, qid, f"{field}.")
        oid = opt.get("id")
        if not isinstance(oid, str) or not OPTION_ID_RE.match(oid):
            raise BankError(file, qid, f"{field}.id", "must be one lower-case letter a-z")
        if any(o.id == oid for o in out):
            raise BankError(file, qid, f"{field}.id", f"duplicate option id {oid!r}")
        misconception = opt.get("misconception")
        if misconception is not None and (not isinstance(misconception, str) or not misconception.strip()):
            raise BankError(file, qid, f"{field}.misconception", "must be a non-empty string")
        out.append(Option(oid, _text(opt.get("text"), file, qid, f"{field}.text"), misconception))
    return tuple(out)


def _choice_answer(kind: str, value: Any, ids: list[str], file: str, qid: str) -> str | frozenset[str]:
    if kind == "single":
        if not isinstance(value, str) or value not in ids:
            raise BankError(file, qid, "answer", f"must be one option id of {', '.join(ids)}")
        return value
    if (not isinstance(value, list) or not value or any(not isinstance(v, str) or v not in ids for v in value)
            or len(set(value)) != len(value)):
        raise BankError(file, qid, "answer", f"must be a non-empty list of distinct option ids of {', '.join(ids)}")
    return frozenset(value)


def placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def _check_templates(text: Text, explanation: Text, generator_name: str, file: str, qid: str) -> None:
    """Every {placeholder} of a computed question must be a parameter its generator gives."""
    known = set(generate(generator_name, 0).params)
    for field, value in (("text", text), ("explanation", explanation)):
        for lang in LANGS:
            try:
                unknown = placeholders(value[lang]) - known
            except ValueError as e:  # an unmatched { or }
                raise BankError(file, qid, f"{field}.{lang}", f"bad template: {e}") from None
            if unknown:
                raise BankError(file, qid, f"{field}.{lang}",
                                f"unknown placeholder {{{sorted(unknown)[0]}}}; {generator_name} gives "
                                f"{', '.join(sorted(known))}")


def _check_no_placeholders(text: Text, file: str, qid: str, field: str) -> None:
    # Only computed questions are templates; a brace elsewhere is almost always a forgotten kind.
    for lang in LANGS:
        if "{" in text[lang] or "}" in text[lang]:
            raise BankError(file, qid, f"{field}.{lang}", "braces are only allowed in computed questions' templates")
