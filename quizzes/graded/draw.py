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
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

from .answers import AnswerForm


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
