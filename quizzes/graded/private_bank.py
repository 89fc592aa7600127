"""The instructor's private bank: one JSON file per graded quiz, kept outside the package and the repository.

`PRIVATE_DIR/<quiz>.json` defines a graded quiz: its title, pass mark, draw plan (tiers) and question pool.
Its choice answers and its diagnosis options' meanings are the answer key, so the folder is the instructor's
alone (with the course secret beside it). The format is checked field by field; an error names the file, the
question and the field. quizzes/README.md documents it; tests/fixtures/private_bank/ is a sample.

Kinds: `single` (one letter right), `multi` (exactly a set of letters right), `diagnosis` (a scenario kind of
quizzes.graded.diagnosis, instantiated `variants` times at build time, each variant a pool question of its own,
asked in `parts`: choice parts whose options say which fact they mean, number parts with a tolerance).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import strict_json
from ..i18n import LANGS
from .diagnosis import DISTRACTOR, SCENARIOS

FORMAT = "minialloc-private-quiz"
VERSION = 1
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,30}$")  # a quiz name is an nbgrader assignment id and a file name
ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,40}$")
KINDS = ("single", "multi", "diagnosis")
MAX_FILE_BYTES = 2 * 1024 * 1024

Text = dict[str, str]


class PrivateBankError(ValueError):
    def __init__(self, file: Path | str, qid: str | None, field: str | None, problem: str) -> None:
        where = [str(file)] + ([f"question {qid!r}"] if qid else []) + ([f"field {field!r}"] if field else [])
        super().__init__(": ".join(where + [problem]))


@dataclass(frozen=True)
class Choice:
    id: str
    text: Text
    means: str | None  # diagnosis options: the fact this option stands for (or "distractor")


@dataclass(frozen=True)
class Part:
    id: str
    text: Text
    options: tuple[Choice, ...]  # empty for a number part
    tolerance: float
    unit: str


@dataclass(frozen=True)
class PrivateQuestion:
    id: str
    kind: str
    text: Text
    options: tuple[Choice, ...]  # single and multi
    answer: tuple[str, ...]  # single and multi: the right option ids
    scenario: str | None  # diagnosis
    variants: int  # diagnosis: how many pool questions it yields
    parts: tuple[Part, ...]  # diagnosis


@dataclass(frozen=True)
class Tier:
    name: str
    kinds: tuple[str, ...]
    count: int  # questions drawn per student
    points: float  # each


@dataclass(frozen=True)
class QuizDefinition:
    name: str
    title: Text
    pass_mark: float
    tiers: tuple[Tier, ...]
    questions: tuple[PrivateQuestion, ...]
    file: Path

    @property
    def max_score(self) -> float:
        return sum(t.count * t.points for t in self.tiers)

    def tier_of(self, kind: str) -> Tier:
        return next(t for t in self.tiers if kind in t.kinds)


class _Checker:
    def __init__(self, file: Path) -> None:
        self.file, self.qid = file, None

    def fail(self, field: str | None, problem: str) -> PrivateBankError:
        return PrivateBankError(self.file, self.qid, field, problem)

    def obj(self, value: Any, field: str | None, keys: set[str], required: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field, "must be an object")
        if unknown := set(value) - keys:
            raise self.fail(field, f"unknown keys {sorted(unknown)}")
        if missing := required - set(value):
            raise self.fail(field, f"missing keys {sorted(missing)}")
        return value

    def text(self, value: Any, field: str) -> Text:
        # English is required (the notebook's common language); Vietnamese and German are shown when given
        if not isinstance(value, dict) or "en" not in value:
            raise self.fail(field, 'must be an object with at least "en"')
        for lang, s in value.items():
            if lang not in LANGS:
                raise self.fail(f"{field}.{lang}", f"unknown language; use {', '.join(LANGS)}")
            if not isinstance(s, str) or not s.strip():
                raise self.fail(f"{field}.{lang}", "must be a non-empty string")
        return dict(value)

    def number(self, value: Any, field: str, lo: float, hi: float, integer: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
            raise self.fail(field, "must be an integer" if integer else "must be a number")
        if not lo <= value <= hi:
            raise self.fail(field, f"must lie in [{lo}, {hi}]")
        return value

    def options(self, value: Any, field: str, with_means: bool) -> tuple[Choice, ...]:
        if not isinstance(value, list) or not 2 <= len(value) <= 6:
            raise self.fail(field, "must be a list of 2 to 6 options")
        out = []
        for i, o in enumerate(value):
            keys = {"id", "text", "means"} if with_means else {"id", "text"}
            o = self.obj(o, f"{field}[{i}]", keys | {"misconception"}, keys)
            if "misconception" in o and (not isinstance(o["misconception"], str) or not o["misconception"].strip()):
                raise self.fail(f"{field}[{i}].misconception", "must be a non-empty string: the mistake it stands for")
            if not isinstance(o["id"], str) or not re.fullmatch(r"[a-z]", o["id"]):
                raise self.fail(f"{field}[{i}].id", "must be one lower-case letter")
            means = o.get("means")
            if with_means and not isinstance(means, str):
                raise self.fail(f"{field}[{i}].means", "must be a string")
            out.append(Choice(o["id"], self.text(o["text"], f"{field}[{i}].text"), means))
        if len({o.id for o in out}) != len(out):
            raise self.fail(field, "option ids must be distinct")
        return tuple(out)


def _question(c: _Checker, raw: Any, index: int) -> PrivateQuestion:
    field = f"questions[{index}]"
    if not isinstance(raw, dict):
        raise c.fail(field, "must be an object")
    c.qid = raw.get("id") if isinstance(raw.get("id"), str) else None
    kind = raw.get("kind")
    if kind not in KINDS:
        raise c.fail("kind", f"must be one of {', '.join(KINDS)}")
    if kind == "diagnosis":
        raw = c.obj(raw, None, {"id", "kind", "idea", "text", "scenario", "variants", "parts"},
                    {"id", "kind", "text", "scenario", "variants", "parts"})
    else:
        raw = c.obj(raw, None, {"id", "kind", "idea", "text", "options", "answer"},
                    {"id", "kind", "text", "options", "answer"})
    if "idea" in raw and (not isinstance(raw["idea"], str) or not raw["idea"].strip()):
        raise c.fail("idea", "must be a non-empty string: the idea the question checks")
    if not isinstance(raw["id"], str) or not ID_RE.match(raw["id"]):
        raise c.fail("id", f"must match {ID_RE.pattern}")
    text = c.text(raw["text"], "text")
    if kind != "diagnosis":
        options = c.options(raw["options"], "options", with_means=False)
        ids = {o.id for o in options}
        answer = raw["answer"]
        if kind == "single":
            if answer not in ids:
                raise c.fail("answer", "must be one of the option ids")
            answer = [answer]
        elif not isinstance(answer, list) or not answer or len(set(answer)) != len(answer) or not set(answer) <= ids:
            raise c.fail("answer", "must be a non-empty list of distinct option ids")
        return PrivateQuestion(raw["id"], kind, text, options, tuple(answer), None, 0, ())
    scenario = raw["scenario"]
    if scenario not in SCENARIOS:
        raise c.fail("scenario", f"unknown; known: {', '.join(sorted(SCENARIOS))}")
    variants = int(c.number(raw["variants"], "variants", 1, 200, integer=True))
    vocab = SCENARIOS[scenario].parts
    if not isinstance(raw["parts"], list) or not raw["parts"]:
        raise c.fail("parts", "must be a non-empty list")
    parts = []
    for i, p in enumerate(raw["parts"]):
        f = f"parts[{i}]"
        p = c.obj(p, f, {"id", "text", "options", "tolerance", "unit"}, {"id", "text"})
        if p["id"] not in vocab:
            raise c.fail(f"{f}.id", f"scenario {scenario} has the parts {', '.join(vocab)}")
        words = vocab[p["id"]]
        if words is None:  # a number part
            if "options" in p or "tolerance" not in p or not isinstance(p.get("unit"), str):
                raise c.fail(f, "a number part has a tolerance and a unit, and no options")
            tol = c.number(p["tolerance"], f"{f}.tolerance", 0, 1e12)
            parts.append(Part(p["id"], c.text(p["text"], f"{f}.text"), (), float(tol), p["unit"]))
            continue
        if "tolerance" in p or "unit" in p or "options" not in p:
            raise c.fail(f, "a choice part has options, and no tolerance or unit")
        options = c.options(p["options"], f"{f}.options", with_means=True)
        for o in options:
            if o.means != DISTRACTOR and o.means not in words:
                raise c.fail(f"{f}.options.{o.id}.means", f"must be {DISTRACTOR!r} or one of {', '.join(words)}")
        for word in words:  # every situation the scenario can draw must have exactly one right option
            if sum(o.means == word for o in options) != 1:
                raise c.fail(f"{f}.options", f"exactly one option must mean {word!r}")
        parts.append(Part(p["id"], c.text(p["text"], f"{f}.text"), options, 0.0, ""))
    if len({p.id for p in parts}) != len(parts):
        raise c.fail("parts", "part ids must be distinct")
    return PrivateQuestion(raw["id"], kind, text, (), (), scenario, variants, tuple(parts))


def load_quiz(bank_dir: Path, name: str | None = None) -> QuizDefinition:
    """The quiz `name` of the private bank (or its only quiz), checked."""
    bank_dir = Path(bank_dir)
    if name is None:
        names = quiz_names(bank_dir)
        if len(names) != 1:
            raise PrivateBankError(bank_dir, None, None, f"holds {len(names)} quizzes ({', '.join(names)}): name one")
        name = names[0]
    if not NAME_RE.match(name):
        raise PrivateBankError(bank_dir, None, None, f"bad quiz name {name!r}")
    file = bank_dir / f"{name}.json"
    c = _Checker(file)
    try:
        data = file.read_bytes()
    except OSError as e:
        raise c.fail(None, f"cannot read ({e.strerror or e})") from None
    if len(data) > MAX_FILE_BYTES:
        raise c.fail(None, f"larger than {MAX_FILE_BYTES} bytes")
    try:
        raw = strict_json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise c.fail(None, f"not valid JSON ({e})") from None
    raw = c.obj(raw, None, {"format", "version", "quiz", "title", "pass_mark", "tiers", "questions"},
                {"format", "version", "quiz", "title", "pass_mark", "tiers", "questions"})
    if raw["format"] != FORMAT or raw["version"] != VERSION:
        raise c.fail("format", f'must be "{FORMAT}", version {VERSION}')
    if raw["quiz"] != name:
        raise c.fail("quiz", f"must be {name!r}, the file's name")
    pass_mark = float(c.number(raw["pass_mark"], "pass_mark", 0.01, 1.0))
    if not isinstance(raw["questions"], list):
        raise c.fail("questions", "must be a list")
    questions = tuple(_question(c, q, i) for i, q in enumerate(raw["questions"]))
    c.qid = None
    if len({q.id for q in questions}) != len(questions):
        raise c.fail("questions", "question ids must be distinct")
    if not isinstance(raw["tiers"], list) or not raw["tiers"]:
        raise c.fail("tiers", "must be a non-empty list")
    tiers, seen = [], set()
    for i, t in enumerate(raw["tiers"]):
        t = c.obj(t, f"tiers[{i}]", {"name", "kinds", "count", "points"}, {"name", "kinds", "count", "points"})
        kinds = t["kinds"]
        if not isinstance(kinds, list) or not kinds or not set(kinds) <= set(KINDS) or set(kinds) & seen:
            raise c.fail(f"tiers[{i}].kinds", "must list kinds, each in one tier only")
        seen |= set(kinds)
        if not isinstance(t["name"], str) or not t["name"]:
            raise c.fail(f"tiers[{i}].name", "must be a non-empty string")
        tier = Tier(t["name"], tuple(kinds), int(c.number(t["count"], f"tiers[{i}].count", 1, 500, integer=True)),
                    float(c.number(t["points"], f"tiers[{i}].points", 0.25, 100)))
        pool = sum(q.variants if q.kind == "diagnosis" else 1 for q in questions if q.kind in tier.kinds)
        if pool < tier.count:
            raise c.fail(f"tiers[{i}].count", f"draws {tier.count} questions from a pool of {pool}")
        tiers.append(tier)
    if unplaced := {q.kind for q in questions} - seen:
        raise c.fail("tiers", f"no tier draws the kinds {sorted(unplaced)}")
    return QuizDefinition(name, c.text(raw["title"], "title"), pass_mark, tuple(tiers), questions, file)


def quiz_names(bank_dir: Path) -> list[str]:
    return sorted(p.stem for p in Path(bank_dir).glob("*.json") if NAME_RE.match(p.stem))
