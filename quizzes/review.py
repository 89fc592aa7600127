"""The bank's review, item by item: the idea each question checks and the misconception behind each wrong answer.

docs/quiz-review.md holds a hand-written part (how the bank was judged and what was rewritten) and, below a marker
line, the part this module writes from the bank itself (`idea`, each wrong option's `misconception`, a numeric
question's wrong rules, a computed question's wrong rules as its generator names them, and what the cue check
measures), so the review cannot drift from the bank: tests/test_quiz_review.py compares the two.

    python -m quizzes.review            # rewrite the generated part of docs/quiz-review.md
    python -m quizzes.review --check    # exit 1 when it is out of date
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from .bank import Bank, Question, load_bank
from .computed import generate
from .cues import MAX_CUE_RATE, CueReport, cue_reports, practice_items, private_items

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "quiz-review.md"
SAMPLE_BANK = ROOT / "tests" / "fixtures" / "private_bank"
MARKER = "<!-- Everything below is written by `python -m quizzes.review` from the bank: edit the bank, not this. -->"


def _plain(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _cue_lines(what: str, reports: Iterable[CueReport]) -> list[str]:
    lines = []
    for r in reports:
        ranked = sorted(r.scores, key=lambda name: -r.scores[name])
        top = ", ".join(f"{name} {r.rate(name):.0%}" for name in ranked[:3])
        lines.append(f"- {what}, {r.lang}: {r.questions} single-choice questions; the best strategies without the "
                     f"idea score {top} (limit {MAX_CUE_RATE:.0%}).")
    return lines


def _question(q: Question) -> list[str]:
    tags = ", ".join([q.kind, *q.tags])
    lines = [f"#### `{q.id}` ({tags})", "", f"- **Idea:** {_plain(q.idea)}", f"- **Asks:** {_plain(q.text['en'])}"]
    if q.exhibit:
        lines.append(f"- **Reads:** {_plain(q.exhibit.splitlines()[0])[:160]} ...")
    if q.kind in ("single", "multi"):
        right = {q.answer} if isinstance(q.answer, str) else set(q.answer or ())
        for o in q.options:
            mark = "right" if o.id in right else f"wrong: {_plain(o.misconception or '')}"
            lines.append(f"- `{o.id}` {_plain(o.text['en'])} — *{mark}*")
    elif q.kind == "numeric":
        lines.append(f"- **Right:** {q.answer:g} ({q.unit['en'] if q.unit else ''})")
        lines += [f"- wrong rule: {_plain(r.rule)} → {r.answer:g}" for r in q.misconceptions]
    else:
        assert q.generator is not None
        variant = generate(q.generator, f"{q.id}|review")
        lines.append(f"- **Computed** by `{q.generator}` on minialloc for each session's numbers; wrong rules, "
                     "each drawn to give another number: " + "; ".join(_plain(w) for w in variant.wrong))
    return lines + [""]


def review(bank: Bank, sample_bank: Path = SAMPLE_BANK) -> str:
    """The generated part of docs/quiz-review.md."""
    from .graded.private_bank import load_quiz

    quiz = load_quiz(sample_bank)
    lines = [MARKER, "", "## What the cue check measures now", ""]
    lines += _cue_lines("practice bank", cue_reports(practice_items(bank)))
    lines += _cue_lines("sample private bank", cue_reports(private_items(quiz.questions)))
    kinds: dict[str, int] = {}
    for q in bank:
        kinds[q.kind] = kinds.get(q.kind, 0) + 1
    counts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    lines += ["", f"The practice bank: {len(bank)} questions ({counts}), "
              f"{sum('review' in q.tags for q in bank)} review questions, {sum(bool(q.exhibit) for q in bank)} that "
              "read an OOM message or a snapshot excerpt.", "", "## The practice bank, item by item", ""]
    for chapter in bank.chapters:
        lines += [f"### Chapter {chapter}: {bank.titles[chapter]['en']}", ""]
        for q in bank.chapter(chapter):
            lines += _question(q)
    lines += ["## The sample private bank's concept questions", ""]
    for pq in quiz.questions:
        if pq.kind == "diagnosis":
            continue
        lines += [f"#### `{pq.id}` ({pq.kind})", "", f"- **Asks:** {_plain(pq.text['en'])}"]
        raw = _private_raw(quiz.file, pq.id)
        if raw.get("idea"):
            lines.append(f"- **Idea:** {_plain(raw['idea'])}")
        for o in raw["options"]:
            right = o["id"] in (raw["answer"] if isinstance(raw["answer"], list) else [raw["answer"]])
            mark = "right" if right else f"wrong: {_plain(o.get('misconception', ''))}"
            lines.append(f"- `{o['id']}` {_plain(o['text']['en'])} — *{mark}*")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _private_raw(path: Path, qid: str) -> dict:
    import json

    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return next(q for q in data["questions"] if q["id"] == qid)


def current(doc: Path = DOC) -> tuple[str, str]:
    """The doc's hand-written part (through the marker line) and its generated part."""
    text = doc.read_text(encoding="utf-8")
    head, sep, tail = text.partition(MARKER)
    if not sep:
        raise ValueError(f"{doc}: no generated part (the marker line is missing)")
    return head, sep + tail


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    head, generated = current()
    fresh = review(load_bank())
    if "--check" in args:
        if generated != fresh:
            print(f"{DOC.relative_to(ROOT)} is out of date: run python -m quizzes.review", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(head + fresh, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
