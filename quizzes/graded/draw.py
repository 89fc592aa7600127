"""Which questions a student answers: a public draw from the student id, the same in the kernel and the grader.

nbgrader releases one notebook to the whole class, so the release holds the prompts of the whole pool, and a
Sheet (the pool's keys per tier, the points, the answer forms; no answer) in a locked cell. draw(sheet, id)
picks each tier's questions with a random.Random seeded by SHA-256 of the quiz and the id: the student runs it
on the id they type to see their questions, and the grader runs it again on nbgrader's own student id, so only
that draw counts. A student who types another id answers another set and earns only for the overlap. The draw
is public on purpose: it reveals which questions a student gets, never their answers (those need the private
bank and the course secret).

Every student gets the same number of questions from each tier, at the tier's points, so every max score is
equal; slot i of every student is worth the same, and is the nbgrader grade cell `slot{i:02d}`.

Where an option is shown follows the same care: `balanced_keys` gives each single-choice question's right option
a position such that, among the questions with the same number of options, every position holds the key equally
often (to within one), and `place_key` puts the other options around it at random. The practice quiz uses them for
a session's questions, the graded quiz for its pool's choice questions and each diagnosis part across its variants,
so "always the first option" (or any position) scores chance, however the bank lists its options.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .answers import AnswerForm

T = TypeVar("T")


@dataclass(frozen=True)
class SheetTier:
    name: str
    points: float
    count: int
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Sheet:
    quiz: str
    tiers: tuple[SheetTier, ...]
    forms: dict[str, AnswerForm]

    @property
    def max_score(self) -> float:
        return sum(t.points * t.count for t in self.tiers)

    @property
    def slot_count(self) -> int:
        return sum(t.count for t in self.tiers)

    def to_json(self) -> str:
        return json.dumps({"quiz": self.quiz,
                           "tiers": [{"name": t.name, "points": t.points, "count": t.count, "keys": list(t.keys)}
                                     for t in self.tiers],
                           "forms": {k: f.to_json() for k, f in self.forms.items()}},
                          ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Sheet:
        data: dict[str, Any] = json.loads(text)
        tiers = tuple(SheetTier(t["name"], float(t["points"]), int(t["count"]), tuple(t["keys"]))
                      for t in data["tiers"])
        return cls(data["quiz"], tiers, {k: AnswerForm.from_json(v) for k, v in data["forms"].items()})


@dataclass(frozen=True)
class Slot:
    grade_id: str  # the nbgrader grade cell this question's points go to: "slot01"
    key: str  # the pool question: "p07"
    points: float


def slot_id(number: int) -> str:
    return f"slot{number:02d}"


def draw(sheet: Sheet, student_id: str) -> list[Slot]:
    """The student's questions, tier by tier (each tier's in pool order), one slot each."""
    digest = hashlib.sha256(f"minialloc-quiz-draw|{sheet.quiz}|{student_id}".encode()).digest()
    rng = random.Random(int.from_bytes(digest, "big"))
    slots: list[Slot] = []
    for tier in sheet.tiers:
        picked = set(rng.sample(tier.keys, tier.count))
        for key in (k for k in tier.keys if k in picked):
            slots.append(Slot(slot_id(len(slots) + 1), key, tier.points))
    return slots


def balanced_keys(option_counts: Sequence[int], rng: random.Random) -> list[int]:
    """The key's position (0-based) for questions with these numbers of options, in this order: per number of
    options, a run of random permutations of the positions, so that each position comes up equally often (+-1)."""
    runs: dict[int, list[int]] = {}
    positions = []
    for n in option_counts:
        run = runs.setdefault(n, [])
        if not run:
            run.extend(range(n))
            rng.shuffle(run)
        positions.append(run.pop())
    return positions


def place_key(options: Sequence[T], key: T, position: int, rng: random.Random) -> list[T]:
    """The options in a random order with `key` at `position`."""
    others = [o for o in options if o is not key]
    if len(others) != len(options) - 1:
        raise ValueError("place_key: the key must be one of the options")
    rng.shuffle(others)
    others.insert(position, key)
    return others
