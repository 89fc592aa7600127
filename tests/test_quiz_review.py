"""docs/quiz-review.md: its item-by-item half is what `python -m quizzes.review` writes from the bank today."""

from __future__ import annotations

from quizzes import load_bank
from quizzes.review import DOC, current, main, review


def test_the_review_is_written_from_the_bank_as_it_is():
    head, generated = current()
    assert generated == review(load_bank()), "docs/quiz-review.md is out of date: run python -m quizzes.review"
    assert main(["--check"]) == 0
    assert "How each item was judged" in head and "26 of 67" in head


def test_the_review_names_every_item_its_idea_and_every_wrong_answer():
    _, generated = current()
    for q in load_bank():
        assert f"#### `{q.id}`" in generated and q.idea.split()[0] in generated, q.id
    practice_wrong = sum(o.misconception is not None for q in load_bank() for o in q.options)
    assert generated.count("*wrong: ") > practice_wrong  # the practice bank's, and the sample private bank's
    assert "*wrong: *" not in generated  # every wrong option of both banks says which misconception it is
    assert DOC.parent.name == "docs"
