"""Cues: can a learner pass a bank's single-choice questions without the idea, by the form of the options alone?

Classic item-writing flaws (Haladyna, Downing & Rodriguez 2002, "A review of multiple-choice item-writing
guidelines", guidelines 24-28: options of about equal length, no cue to the right answer, the key's position
balanced) let a test-wise learner score far above chance with a fixed strategy. Picking the longest option is
the one everyone knows; a bank rewritten against it alone moves the key to the second-longest option, which is
just as easy to use (the bank of issue 33 had it right in 56% of its English questions). So this module
measures every such strategy, per language, over the single-choice questions that have that language:

- **every length rank**: always pick the longest, the second-longest, ... and the shortest, the second-shortest,
  ... option (lengths as a learner sees them: markup removed, spaces collapsed);
- **every position**: always pick the first, the second, ... option as the bank lists them (the practice quiz
  and the graded quiz also balance the shown positions, `quizzes.graded.draw.balanced_order`);
- **the most qualified-looking option**: the one with the most commas, colons, dashes and brackets and the most
  clause words ("only", "because", "unless", "which" ...; their Vietnamese and German equivalents), the careful
  answer a test-wise learner trusts.

A strategy that cannot tell options apart (a tie) counts as a guess among the tied ones: picking "the longest"
among three equally long options gets one third of a point on average; a rank or position a question does not
have counts as a guess among all its options. A bank passes when no strategy scores above MAX_CUE_RATE of a
language's questions (chance is 25% with four options).

`python -m quizzes check` applies it to the practice bank (and to a private bank with `--private-bank DIR`);
`python -m quizzes build-graded` refuses a private bank that fails it unless given `--allow-cues`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .i18n import LANGS

if TYPE_CHECKING:
    from .bank import Question
    from .graded.private_bank import PrivateQuestion

MAX_CUE_RATE = 0.35  # with four options chance is 25%; 35% is a cue a learner can feel and use

_MARKUP = str.maketrans("", "", "`*")
_PUNCTUATION = re.compile(r"[,;:()\[\]—–]| - ")
# Words that open a clause or qualify a claim ("only when ...", "because ...", "unless ..."): what makes an option
# look careful. Matched as whole words, case-folded.
QUALIFIERS: dict[str, tuple[str, ...]] = {
    "en": ("only", "because", "since", "unless", "except", "which", "whose", "when", "whenever", "while", "if",
           "so", "but", "though", "although", "until", "as long as", "provided", "whereas", "once", "then"),
    "vi": ("chỉ", "vì", "bởi", "do", "nên", "khi", "nếu", "trừ", "ngoại trừ", "mà", "cho đến khi", "miễn là",
           "tuy", "nhưng", "để", "thì", "sau khi", "trước khi"),
    "de": ("nur", "weil", "da", "denn", "wenn", "sofern", "außer", "solange", "bis", "damit", "sodass", "obwohl",
           "aber", "falls", "während", "sobald", "dann", "dass", "nachdem", "bevor"),
}
_QUALIFIER_RE = {lang: re.compile(r"(?<!\w)(?:" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
                                  + r")(?!\w)", re.IGNORECASE)
                 for lang, words in QUALIFIERS.items()}


@dataclass(frozen=True)
class ChoiceItem:
    """One single-choice question in one language: its option texts by id in the bank's order, and the key."""

    qid: str
    options: Mapping[str, str]
    answer: str


@dataclass(frozen=True)
class Strategy:
    """A rule that picks options without the idea: `weights(item, lang)` gives each option's chance of a pick."""

    name: str
    weights: Callable[[ChoiceItem, str], dict[str, float]]


def shown_length(text: str) -> int:
    """The option's length as a learner sees it: `code` and **bold** markers are not shown."""
    return len(" ".join(text.translate(_MARKUP).split()))


def qualification(text: str, lang: str) -> int:
    """How careful an option looks: its commas, colons, dashes and brackets plus its clause and hedge words."""
    shown = " ".join(text.translate(_MARKUP).split())
    return len(_PUNCTUATION.findall(shown)) + len(_QUALIFIER_RE[lang].findall(shown))


def _uniform(item: ChoiceItem) -> dict[str, float]:
    return {oid: 1 / len(item.options) for oid in item.options}


def _pick_value(item: ChoiceItem, value: Mapping[str, int], target: int) -> dict[str, float]:
    chosen = [oid for oid in item.options if value[oid] == target]
    return {oid: 1 / len(chosen) for oid in chosen}


def _length_rank(rank: int, longest_first: bool) -> Callable[[ChoiceItem, str], dict[str, float]]:
    def weights(item: ChoiceItem, lang: str) -> dict[str, float]:
        if rank > len(item.options):
            return _uniform(item)
        lengths = {oid: shown_length(text) for oid, text in item.options.items()}
        ordered = sorted(lengths.values(), reverse=longest_first)
        return _pick_value(item, lengths, ordered[rank - 1])  # ties: a guess among the equally long ones
    return weights


def _position(position: int) -> Callable[[ChoiceItem, str], dict[str, float]]:
    def weights(item: ChoiceItem, lang: str) -> dict[str, float]:
        ids = list(item.options)
        return {ids[position - 1]: 1.0} if position <= len(ids) else _uniform(item)
    return weights


def _most_qualified(item: ChoiceItem, lang: str) -> dict[str, float]:
    scores = {oid: qualification(text, lang) for oid, text in item.options.items()}
    return _pick_value(item, scores, max(scores.values()))


def _ordinal(n: int) -> str:
    return {1: "", 2: "second-", 3: "third-", 4: "fourth-", 5: "fifth-"}.get(n, f"{n}th-")


def strategies(max_options: int) -> list[Strategy]:
    """Every strategy measured on questions of up to `max_options` options."""
    out: list[Strategy] = []
    for rank in range(1, max_options + 1):
        out.append(Strategy(f"the {_ordinal(rank)}longest option", _length_rank(rank, True)))
        out.append(Strategy(f"the {_ordinal(rank)}shortest option", _length_rank(rank, False)))
    for position in range(1, max_options + 1):
        out.append(Strategy(f"option {position} as listed", _position(position)))
    out.append(Strategy("the most qualified-looking option (commas, clauses, only/because)", _most_qualified))
    return out


@dataclass(frozen=True)
class CueReport:
    """What each strategy scores on one language's single-choice questions (expected number right)."""

    lang: str
    questions: int
    scores: Mapping[str, float]

    def rate(self, strategy: str) -> float:
        return self.scores[strategy] / self.questions if self.questions else 0.0

    @property
    def worst(self) -> str:
        """The strategy that scores most (the first such in the measuring order)."""
        return max(self.scores, key=lambda name: self.scores[name])

    @property
    def failing(self) -> list[str]:
        return [name for name in self.scores if self.rate(name) > MAX_CUE_RATE]

    @property
    def passes(self) -> bool:
        return not self.failing

    def line(self) -> str:
        shown = self.failing or [self.worst]
        picks = ", ".join(f"picking {name} scores {self.rate(name):.0%}" for name in shown)
        best = "" if self.failing else "at most: "
        return f"{self.lang}: {best}{picks} of {self.questions} single-choice questions (limit {MAX_CUE_RATE:.0%})"


def measure(lang: str, items: Iterable[ChoiceItem]) -> CueReport:
    """Every strategy's expected score; a strategy that picks exactly as an earlier one on every question (the
    second-longest of four options is the third-shortest) is reported once, under the earlier name."""
    listed = list(items)
    most = max((len(item.options) for item in listed), default=0)
    scores: dict[str, float] = {}
    seen: set[tuple[tuple[tuple[str, float], ...], ...]] = set()
    for s in strategies(most):
        picks = [s.weights(item, lang) for item in listed]
        signature = tuple(tuple(sorted(p.items())) for p in picks)
        if signature in seen:
            continue
        seen.add(signature)
        scores[s.name] = sum(p.get(item.answer, 0.0) for p, item in zip(picks, listed, strict=True))
    return CueReport(lang, len(listed), scores)


def cue_reports(by_lang: Mapping[str, Sequence[ChoiceItem]]) -> list[CueReport]:
    """One report per language that has single-choice questions, in the course's language order."""
    return [measure(lang, by_lang[lang]) for lang in LANGS if by_lang.get(lang)]


def practice_items(questions: Iterable[Question]) -> dict[str, list[ChoiceItem]]:
    """The practice bank's single-choice questions, per language (every one has all three)."""
    out: dict[str, list[ChoiceItem]] = {lang: [] for lang in LANGS}
    for q in questions:
        if q.kind == "single" and isinstance(q.answer, str):
            for lang in LANGS:
                out[lang].append(ChoiceItem(q.id, {o.id: o.text[lang] for o in q.options}, q.answer))
    return out


def private_items(questions: Iterable[PrivateQuestion]) -> dict[str, list[ChoiceItem]]:
    """A private bank's single-choice questions (quizzes.graded.private_bank.PrivateQuestion), per language.

    English is required there and Vietnamese and German are optional, so a question counts for a language
    when every one of its options is written in it.
    """
    out: dict[str, list[ChoiceItem]] = {lang: [] for lang in LANGS}
    for q in questions:
        if q.kind != "single":
            continue
        for lang in LANGS:
            if all(lang in o.text for o in q.options):
                out[lang].append(ChoiceItem(q.id, {o.id: o.text[lang] for o in q.options}, q.answer[0]))
    return out


def failures(reports: Iterable[CueReport]) -> list[CueReport]:
    return [r for r in reports if not r.passes]


def refusal(what: str, reports: Iterable[CueReport]) -> str | None:
    """A one-line reason a bank fails the cue rule, or None when it passes."""
    bad = failures(reports)
    if not bad:
        return None
    return (f"{what} can be passed without the idea, by the form of its options: "
            + "; ".join(r.line() for r in bad)
            + ". Rewrite the options to similar length and form, the key at every rank and position "
              "(distractors that are real misconceptions)")
