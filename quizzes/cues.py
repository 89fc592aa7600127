"""The option-length cue: can a learner pass a bank's single-choice questions without the idea?

A classic item-writing flaw (Haladyna, Downing & Rodriguez 2002, "A review of multiple-choice item-writing
guidelines", guideline 24: keep options about equal in length) is a right answer that is visibly the longest
(the most qualified, most careful option) or the shortest one. A test-wise learner who always picks the
longest option, or always the shortest, then scores far above chance. This module measures that strategy per
language, over the single-choice questions that have that language, and a bank passes when neither picking
the longest nor the shortest option scores above MAX_CUE_RATE.

Ties count as a guess among the tied options: a learner who picks "the longest" among three equally long
options gets one third of a point on average. Lengths are counted on the text a learner sees (markup removed).

`python -m quizzes check` applies it to the practice bank (and to a private bank with `--private-bank DIR`);
`python -m quizzes build-graded` refuses a private bank that fails it unless given `--allow-cues`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .i18n import LANGS

if TYPE_CHECKING:
    from .bank import Question
    from .graded.private_bank import PrivateQuestion

MAX_CUE_RATE = 0.40  # with four options, chance is 25%: 40% is a cue a learner can feel and use

_MARKUP = str.maketrans("", "", "`*")


@dataclass(frozen=True)
class ChoiceItem:
    """One single-choice question in one language: its option texts by id, and the right option's id."""

    qid: str
    options: Mapping[str, str]
    answer: str


@dataclass(frozen=True)
class CueReport:
    """What "always pick the longest" and "always pick the shortest" score on one language's questions."""

    lang: str
    questions: int
    longest: float  # expected number right by picking the longest option (ties shared)
    shortest: float

    @property
    def longest_rate(self) -> float:
        return self.longest / self.questions if self.questions else 0.0

    @property
    def shortest_rate(self) -> float:
        return self.shortest / self.questions if self.questions else 0.0

    @property
    def passes(self) -> bool:
        return self.longest_rate <= MAX_CUE_RATE and self.shortest_rate <= MAX_CUE_RATE

    def line(self) -> str:
        return (f"{self.lang}: picking the longest option scores {self.longest_rate:.0%}, the shortest "
                f"{self.shortest_rate:.0%} of {self.questions} single-choice questions (limit {MAX_CUE_RATE:.0%})")


def shown_length(text: str) -> int:
    """The option's length as a learner sees it: `code` and **bold** markers are not shown."""
    return len(" ".join(text.translate(_MARKUP).split()))


def _share(lengths: Mapping[str, int], answer: str, pick: int) -> float:
    chosen = [oid for oid, n in lengths.items() if n == pick]
    return 1 / len(chosen) if answer in chosen else 0.0


def measure(lang: str, items: Iterable[ChoiceItem]) -> CueReport:
    count, longest, shortest = 0, 0.0, 0.0
    for item in items:
        lengths = {oid: shown_length(text) for oid, text in item.options.items()}
        longest += _share(lengths, item.answer, max(lengths.values()))
        shortest += _share(lengths, item.answer, min(lengths.values()))
        count += 1
    return CueReport(lang, count, longest, shortest)


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
    return (f"{what} can be passed by the length of its options: " + "; ".join(r.line() for r in bad)
            + ". Rewrite the options to similar length and form (distractors that are real misconceptions)")
