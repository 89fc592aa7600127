"""The pool: the private bank made concrete with the course secret. Instructor-side only: it holds the answers.

Each single or multi question is one pool question; each diagnosis question yields `variants` pool questions,
each running its scenario on minialloc with a random.Random keyed by HMAC(secret, quiz, question, variant).
Options are shuffled per pool question with the secret and relabelled a, b, c..., so a letter means nothing
outside its question. The result holds, per pool question, the prompt (markdown, public once released), the
answer form (public) and the expected answer (private). build.py writes the prompts into the notebook;
scoring.py compares the answers. The fingerprint (SHA-256 of everything public, plus the secret's tag) lets
the grader refuse to grade against a pool that is not the released one (the bank, the secret or minialloc
changed since `build-graded`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..i18n import LANG_NAMES, LANGS
from . import diagnosis, secret
from .answers import AnswerForm
from .draw import Sheet, SheetTier, balanced_keys, place_key
from .private_bank import Choice, PrivateBankError, PrivateQuestion, QuizDefinition, load_quiz

LETTERS = "abcdefgh"
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True)
class PoolQuestion:
    key: str  # "p07": the name in the student's answers dict
    source: str  # the private bank question, and the variant: "oom-diagnosis#3"
    tier: str
    points: float
    markdown: str  # the prompt, as the notebook shows it
    form: AnswerForm
    expected: tuple[Any, ...]  # private: as answers.parse_answer normalises a right answer
    tolerances: tuple[float, ...]  # per entry of expected (0 for letters)


@dataclass(frozen=True)
class Pool:
    quiz: QuizDefinition
    questions: tuple[PoolQuestion, ...]
    fingerprint: str

    def sheet(self) -> Sheet:
        tiers = tuple(SheetTier(t.name, t.points, t.count, tuple(q.key for q in self.questions if q.tier == t.name))
                      for t in self.quiz.tiers)
        return Sheet(self.quiz.name, tiers, {q.key: q.form for q in self.questions})

    def question(self, key: str) -> PoolQuestion:
        for q in self.questions:
            if q.key == key:
                return q
        raise KeyError(key)


def _fill(template: str, params: dict[str, str], where: str) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1) not in params:
            raise PrivateBankError(where, None, None, f"placeholder {{{m.group(1)}}} is not one its scenario gives "
                                   f"({', '.join(sorted(params)) or 'none'})")
        return params[m.group(1)]
    return _PLACEHOLDER.sub(one, template)


def _shuffled(options: tuple[Choice, ...], key: bytes, *parts: str, right: Choice | None = None,
              position: int = 0) -> list[tuple[str, Choice]]:
    """The options shuffled with the secret, relabelled a, b, c...; `right` (when given) at `position`."""
    shuffler = secret.rng(key, "options", *parts)
    order = list(options)
    if right is None:
        shuffler.shuffle(order)
    else:
        order = place_key(order, right, position, shuffler)
    return list(zip(LETTERS, order, strict=False))


def _lang_lines(text: dict[str, str], params: dict[str, str], where: str) -> list[str]:
    return [f"**{LANG_NAMES[lang]}.** {_fill(text[lang], params, where)}" for lang in LANGS if lang in text]


def _option_lines(labelled: list[tuple[str, Choice]]) -> list[str]:
    return [f"- **{letter}**) " + " / ".join(o.text[lang] for lang in LANGS if lang in o.text)
            for letter, o in labelled]


def _heading(key: str, points: float) -> str:
    return f"### {key} · {points:g} {'point' if points == 1 else 'points'}"


def _choice_question(quiz: QuizDefinition, q: PrivateQuestion, key: str, skey: bytes, position: int = 0
                     ) -> PoolQuestion:
    tier = quiz.tier_of(q.kind)
    right = next(o for o in q.options if o.id == q.answer[0]) if q.kind == "single" else None
    labelled = _shuffled(q.options, skey, quiz.name, q.id, right=right, position=position)
    letter_of = {o.id: letter for letter, o in labelled}
    form = AnswerForm(q.kind, LETTERS[: len(labelled)])
    lines = [_heading(key, tier.points), "", *_lang_lines(q.text, {}, f"{quiz.file}: {q.id}"), ""]
    if q.kind == "multi":
        lines += ["*Several answers can be right: give all of them.*", ""]
    lines += _option_lines(labelled)
    lines += ["", f"Answer: `answers[\"{key}\"] = ...`, {form.describe()}."]
    expected: tuple[Any, ...]
    if q.kind == "single":
        expected = (letter_of[q.answer[0]],)
    else:
        expected = (frozenset(letter_of[a] for a in q.answer),)
    return PoolQuestion(key, q.id, tier.name, tier.points, "\n".join(lines) + "\n", form, expected, (0.0,))


def _diagnosis_question(quiz: QuizDefinition, q: PrivateQuestion, variant: int, key: str, skey: bytes,
                        positions: dict[str, list[int]]) -> PoolQuestion:
    tier = quiz.tier_of(q.kind)
    assert q.scenario is not None
    scenario = diagnosis.generate(q.scenario, secret.rng(skey, "scenario", quiz.name, q.id, str(variant)))
    where = f"{quiz.file}: {q.id}"
    lines = [_heading(key, tier.points), "", *_lang_lines(q.text, scenario.params, where), "", "```text",
             scenario.exhibit, "```", ""]
    specs: list[tuple[str, str]] = []
    expected: list[Any] = []
    tolerances: list[float] = []
    for number, part in enumerate(q.parts, 1):
        fact = scenario.facts[part.id]
        lines.append(f"**Part {number}.**")
        lines += _lang_lines(part.text, scenario.params, where)
        if part.options:
            right = next(o for o in part.options if o.means == fact)
            labelled = _shuffled(part.options, skey, quiz.name, q.id, str(variant), part.id, right=right,
                                 position=positions[part.id][variant - 1])
            lines += ["", *_option_lines(labelled)]
            specs.append(("choice", LETTERS[: len(labelled)]))
            expected.append(next(letter for letter, o in labelled if o.means == fact))
            tolerances.append(0.0)
        else:
            lines.append(f"*Answer in {part.unit}.*")
            specs.append(("number", part.unit))
            expected.append(float(fact))
            tolerances.append(part.tolerance)
        lines.append("")
    form = AnswerForm("parts", "", tuple(specs))
    lines.append(f"Answer: `answers[\"{key}\"] = {form.example()}`, {form.describe()}.")
    return PoolQuestion(key, f"{q.id}#{variant}", tier.name, tier.points, "\n".join(lines) + "\n", form,
                        tuple(expected), tuple(tolerances))


def _fingerprint(quiz: QuizDefinition, questions: Iterable[PoolQuestion], skey: bytes) -> str:
    public = [[q.key, q.tier, q.points, q.markdown, q.form.to_json()] for q in questions]
    blob = json.dumps({"quiz": quiz.name, "pass_mark": quiz.pass_mark, "questions": public,
                       "secret": secret.fingerprint(skey)}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def build_pool(quiz: QuizDefinition, skey: bytes, *, progress: bool = False) -> Pool:
    """Every pool question of `quiz`, keys p01, p02... tier by tier. `progress` shows a tqdm bar (build time)."""
    jobs: list[tuple[PrivateQuestion, int]] = []
    for tier in quiz.tiers:
        for q in quiz.questions:
            if q.kind in tier.kinds:
                jobs += [(q, v) for v in range(1, q.variants + 1)] if q.kind == "diagnosis" else [(q, 0)]
    width = max(2, len(str(len(jobs))))
    items: Iterable[tuple[int, tuple[PrivateQuestion, int]]] = enumerate(jobs, 1)
    if progress:
        from tqdm.auto import tqdm  # instructor-side only; the kernel and the grader never draw a bar

        items = tqdm(items, total=len(jobs), desc=f"{quiz.name}: questions", unit="q")
    # where each right option is shown: balanced over the single-choice questions, and for each diagnosis part
    # over its question's variants (draw.balanced_keys), so no position is a cue
    singles = [q for q in quiz.questions if q.kind == "single"]
    single_at = dict(zip((q.id for q in singles), balanced_keys([len(q.options) for q in singles],
                                                                  secret.rng(skey, "positions", quiz.name)),
                         strict=True))
    part_at = {q.id: {part.id: balanced_keys([len(part.options)] * q.variants,
                                             secret.rng(skey, "positions", quiz.name, q.id, part.id))
                      for part in q.parts if part.options}
               for q in quiz.questions if q.kind == "diagnosis"}
    questions = []
    for number, (q, variant) in items:
        key = f"p{number:0{width}d}"
        questions.append(_diagnosis_question(quiz, q, variant, key, skey, part_at[q.id]) if q.kind == "diagnosis"
                         else _choice_question(quiz, q, key, skey, single_at.get(q.id, 0)))
    return Pool(quiz, tuple(questions), _fingerprint(quiz, questions, skey))


_CACHE: dict[tuple[str, bytes, str], Pool] = {}


def load_pool(bank_dir: Path, skey: bytes, quiz: str | None = None) -> Pool:
    """The pool of a private bank's quiz, built once per process for the same bank file and secret (grading
    a class calls this once per submission)."""
    definition = load_quiz(bank_dir, quiz)
    digest = hashlib.sha256(definition.file.read_bytes()).hexdigest()
    cache_key = (digest, hashlib.sha256(skey).digest(), definition.name)
    if cache_key not in _CACHE:
        _CACHE[cache_key] = build_pool(definition, skey)
    return _CACHE[cache_key]
