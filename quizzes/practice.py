"""The practice quiz's logic, without any widget: a session over a few bank questions, and a text rendering.

PracticeSession holds the student's copy of the questions (the payload): shuffled questions and options, and the
answers and explanations sealed (quizzes.obfuscate), opened only when the student checks an answer. It knows the
progress and the score: a question counts as right when its FIRST check is right; a wrong answer can be changed
and checked again, which teaches but does not score. The explanation opens after a right answer or after the
second check: shown after the first wrong one, it would hand over the answer and make the retry a formality.
retry() starts a new round: a new order, new option orders, new numbers for the computed questions.

quizzes.widget draws a session with ipywidgets; TextQuiz prints it, for nbconvert, CI logs and terminals.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import secrets
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from minialloc.lang import messages

from .bank import Question, Text
from .graded.draw import balanced_keys, place_key
from .i18n import LANGS, check_lang, pick, to_plain, ui
from .obfuscate import seal, unseal

# Headings for the quizzes made of one tag's questions (quizzes.practice(tag=...)).
TAG_TITLES = messages("quizzes.practice.TAG_TITLES", {
    "faq": "The course page's own quiz: check your understanding",
})


@dataclass(frozen=True)
class Item:
    """One question as the student's copy holds it: no answer and no explanation in clear."""

    qid: str
    kind: str
    text: Text
    options: tuple[tuple[str, Text], ...]  # (option id, label per language), in this session's shuffled order
    unit: Text | None
    exhibit: str
    key: str  # sealed {"answer": ..., "tolerance": ...}
    explanation: str  # sealed {"en": ..., "vi": ..., "de": ...}


@dataclass(frozen=True)
class Payload:
    salt: bytes
    items: tuple[Item, ...]

    def to_json(self) -> str:
        """Everything the student's copy holds, as one JSON text (what tests scan for leaked answers)."""
        return json.dumps({"salt": self.salt.hex(), "items": [asdict(i) for i in self.items]}, ensure_ascii=False)


@dataclass(frozen=True)
class Feedback:
    status: str  # "correct", "wrong" or "invalid" (no answer given, or not a number: not counted)
    message: str
    explanation: str = ""

    @property
    def correct(self) -> bool:
        return self.status == "correct"


EXPLAIN_AFTER_CHECKS = 2  # a wrong first answer gets a retry before the explanation

_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def parse_number(value: object) -> float | None:
    """A typed answer as a number: "20", "1.5", "1,5" (decimal comma), "1 536", "20 MiB"; None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    text = re.sub(r"\s*[A-Za-z%]+$", "", text)  # a unit typed after the number
    text = re.sub(r"(?<=\d)[\s_\u00a0\u202f](?=\d{3}\b)", "", text)  # thousands separated by spaces
    if text.count(",") == 1 and "." not in text:
        text = text.replace(",", ".")  # German and Vietnamese write 1,5
    if not _NUMBER.match(text):
        return None
    number = float(text)
    return number if math.isfinite(number) else None


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def build_payload(questions: Sequence[Question], seed: object, round_: int, limit: int | None = None) -> Payload:
    """Shuffle questions and options with (seed, round), render computed ones, and seal answers."""
    salt = secrets.token_bytes(16)
    order = list(questions)
    _rng(seed, round_, "order").shuffle(order)
    if limit is not None:
        order = order[:limit]
    # the right option of the session's single-choice questions at every position equally often (graded.draw)
    singles = [q for q in order if q.kind == "single"]
    key_at = dict(zip((q.id for q in singles),
                      balanced_keys([len(q.options) for q in singles], _rng(seed, round_, "positions")), strict=True))
    items = []
    for q in order:
        r = q.render(f"{seed}|{round_}")
        options = list(r.options)
        shuffler = _rng(seed, round_, q.id, "options")
        if q.id in key_at:
            options = place_key(options, next(o for o in options if o.id == r.answer), key_at[q.id], shuffler)
        else:
            shuffler.shuffle(options)
        answer = sorted(r.answer) if isinstance(r.answer, frozenset) else r.answer
        items.append(Item(
            qid=q.id,
            kind=q.kind,
            text=r.text,
            options=tuple((o.id, o.text) for o in options),
            unit=r.unit,
            exhibit=r.exhibit,
            key=seal({"answer": answer, "tolerance": r.tolerance}, salt, f"{q.id}|key"),
            explanation=seal(r.explanation, salt, f"{q.id}|explanation"),
        ))
    return Payload(salt, tuple(items))


@dataclass
class _State:
    index: int = 0
    attempts: dict[str, int] = field(default_factory=dict)
    first_try: dict[str, bool] = field(default_factory=dict)  # qid -> right at the first check
    last: dict[str, str] = field(default_factory=dict)  # qid -> status of the latest check


class PracticeSession:
    """A round of practice questions: check answers, move on, switch language, start again."""

    def __init__(self, questions: Sequence[Question], lang: str = "en", seed: object = None,
                 title: Text | None = None, limit: int | None = None) -> None:
        if not questions:
            raise ValueError("a practice session needs at least one question")
        self.questions = list(questions)
        self.seed = secrets.randbits(64) if seed is None else seed
        self.lang = check_lang(lang)
        self.title = title or {lang: ui("title", lang) for lang in LANGS}
        self.limit = limit
        self.round = 0
        self._start()

    def _start(self) -> None:
        self.payload = build_payload(self.questions, self.seed, self.round, self.limit)
        self.state = _State()

    # -- where we are ----------------------------------------------------------------------------------------
    @property
    def items(self) -> tuple[Item, ...]:
        return self.payload.items

    @property
    def total(self) -> int:
        return len(self.items)

    @property
    def finished(self) -> bool:
        return self.state.index >= self.total

    @property
    def current(self) -> Item:
        if self.finished:
            raise IndexError("the round is finished: call retry() to start again")
        return self.items[self.state.index]

    @property
    def score(self) -> int:
        return sum(self.state.first_try.values())

    @property
    def answered(self) -> int:
        return len(self.state.first_try)

    def progress(self) -> str:
        i = min(self.state.index + 1, self.total)
        return ui("progress", self.lang, i=i, n=self.total, score=self.score, answered=self.answered)

    def summary(self) -> str:
        return ui("done", self.lang, score=self.score, n=self.total)

    # -- actions -----------------------------------------------------------------------------------------------
    def set_lang(self, lang: str) -> None:
        self.lang = check_lang(lang)

    def check(self, response: object) -> Feedback:
        """Check an answer to the current question: an option id, a collection of ids, or a number."""
        item = self.current
        given = self._read(item, response)
        if given is None:
            key = {"single": "choose_one", "multi": "choose_many"}.get(item.kind, "not_a_number")
            return Feedback("invalid", ui(key, self.lang))
        key = unseal(item.key, self.payload.salt, f"{item.qid}|key")
        if item.kind == "single":
            right = given == key["answer"]
        elif item.kind == "multi":
            right = given == set(key["answer"])
        else:
            # a hair of slack so that 0.1 + 0.2 style float noise never turns a right answer wrong
            right = abs(given - key["answer"]) <= key["tolerance"] + 1e-9 * max(1.0, abs(key["answer"]))
        status = "correct" if right else "wrong"
        self.state.attempts[item.qid] = self.state.attempts.get(item.qid, 0) + 1
        self.state.first_try.setdefault(item.qid, right)
        self.state.last[item.qid] = status
        return self.feedback(item.qid)

    def feedback(self, qid: str) -> Feedback:
        """The feedback of a question's latest check, in the current language (for a language switch)."""
        status = self.state.last.get(qid)
        if status is None:
            return Feedback("invalid", "")
        message = ui("correct" if status == "correct" else "wrong", self.lang)
        if not self.explanation_open(qid):
            return Feedback(status, message)
        explanation = unseal(self._item(qid).explanation, self.payload.salt, f"{qid}|explanation")
        return Feedback(status, message, explanation[self.lang])

    def explanation_open(self, qid: str) -> bool:
        """True once the question was answered right, or checked EXPLAIN_AFTER_CHECKS times (a second try)."""
        return (self.state.last.get(qid) == "correct"
                or self.state.attempts.get(qid, 0) >= EXPLAIN_AFTER_CHECKS)

    def next(self) -> None:
        if not self.finished:
            self.state.index += 1

    def retry(self) -> None:
        """A new round: new order, new option order, new numbers; score starts from zero."""
        self.round += 1
        self._start()

    # -- helpers -------------------------------------------------------------------------------------------------
    def _item(self, qid: str) -> Item:
        return next(i for i in self.items if i.qid == qid)

    @staticmethod
    def _read(item: Item, response: object) -> str | set[str] | float | None:
        ids = {oid for oid, _ in item.options}
        if item.kind == "single":
            return response if isinstance(response, str) and response in ids else None
        if item.kind == "multi":
            if isinstance(response, str) or not isinstance(response, Collection):
                return None
            chosen = set(response)
            return chosen if chosen and chosen <= ids else None
        return parse_number(response)


def render_text(session: PracticeSession, lang: str | None = None) -> str:
    """Every question of the round as plain text, options lettered, answers left out."""
    lang = check_lang(lang or session.lang)
    lines = [pick(session.title, lang), ui("text_mode", lang), ""]
    for n, item in enumerate(session.items, 1):
        lines.append(f"{n}. {to_plain(pick(item.text, lang))}")
        if item.exhibit:
            lines += ["", *("    " + line for line in item.exhibit.splitlines()), ""]
        if item.kind == "multi":
            lines.append(f"   ({ui('select_all', lang)})")
        for letter, (_, label) in zip("ABCDEF", item.options, strict=False):
            lines.append(f"   {letter}) {to_plain(pick(label, lang))}")
        if item.unit is not None:
            lines.append(f"   {ui('answer_in', lang, unit=pick(item.unit, lang))}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


class TextQuiz:
    """The quiz as text: what practice() returns where no widget can be shown (nbconvert, a terminal)."""

    def __init__(self, session: PracticeSession) -> None:
        self.session = session

    def __str__(self) -> str:
        return render_text(self.session)

    def __repr__(self) -> str:
        return render_text(self.session)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython's plain-text display (p: a PrettyPrinter)
        p.text(render_text(self.session))
