"""The practice quiz: checking, feedback, languages, shuffling, retry, the sealed payload, the widget and the text."""

from __future__ import annotations

import html
import json

import pytest

import quizzes
from quizzes import LANGS, PracticeSession, load_bank
from quizzes.i18n import UI
from quizzes.obfuscate import seal, unseal
from quizzes.practice import parse_number, render_text
from quizzes.widget import PracticeQuiz

BANK = load_bank()


def session(ids, seed=1, lang="en") -> PracticeSession:
    return PracticeSession([BANK[i] for i in ids], lang=lang, seed=seed)


def answer_of(s: PracticeSession, qid: str):
    """The right answer, computed here from the bank as the session would (for computed: same seed and round)."""
    return BANK[qid].render(f"{s.seed}|{s.round}").answer


def wrong_option(s: PracticeSession) -> str:
    right = answer_of(s, s.current.qid)
    return next(oid for oid, _ in s.current.options if oid != right)


def test_wrong_then_right_single():
    s = session(["c2-5gb-2gb"])
    fb = s.check(wrong_option(s))
    assert fb.status == "wrong" and fb.message == UI["wrong"]["en"]
    assert fb.explanation == ""  # the first miss gets a retry, not the answer's explanation
    fb = s.check(answer_of(s, "c2-5gb-2gb"))
    assert fb.correct and fb.message == UI["correct"]["en"]
    assert fb.explanation == BANK["c2-5gb-2gb"].explanation["en"]
    assert (s.score, s.answered) == (0, 1)  # only the first check counts
    assert s.state.attempts["c2-5gb-2gb"] == 2


def test_explanation_after_a_right_answer_or_a_second_try():
    s = session(["c2-5gb-2gb", "c1-pools"])
    first = s.current.qid
    assert s.check(answer_of(s, first)).explanation == BANK[first].explanation["en"]  # right at once
    s.next()
    second = s.current.qid
    wrong = wrong_option(s)
    assert s.check(wrong).explanation == ""
    assert s.feedback(second).explanation == ""  # nor after a language switch redraws it
    fb = s.check(wrong)  # the same wrong answer, checked again: the second try opens the explanation
    assert fb.status == "wrong" and fb.explanation == BANK[second].explanation["en"]
    s.set_lang("de")
    assert s.feedback(second).explanation == BANK[second].explanation["de"]


def test_right_at_once_scores():
    s = session(["c2-5gb-2gb", "c1-pools"])
    s.check(answer_of(s, s.current.qid))
    s.next()
    s.check(wrong_option(s))
    assert (s.score, s.answered) == (1, 2)
    s.next()
    assert s.finished and "1" in s.summary()


def test_multi_needs_exactly_the_right_set():
    s = session(["c2-empty-cache"])
    right = set(answer_of(s, "c2-empty-cache"))
    assert s.check({next(iter(right))}).status == "wrong"  # a subset is not enough
    assert s.check(right | {"c"}).status == "wrong"  # nor a superset
    assert s.check(right).correct


def test_invalid_answers_are_not_counted():
    s = session(["c2-5gb-2gb"])
    assert s.check(None).status == "invalid" and s.check("zz").status == "invalid"
    assert s.answered == 0 and s.state.attempts == {}
    t = session(["c1-eleven-mib"])
    fb = t.check("twelve")
    assert fb.status == "invalid" and fb.message == UI["not_a_number"]["en"] and t.answered == 0


def test_numeric_and_tolerance():
    s = session(["c2-frag-figure"])  # 0.4, tolerance 0.005
    assert s.check("0,41").status == "wrong"
    assert s.check("0,4").correct  # a decimal comma, as vi and de write it
    t = session(["c1-eleven-mib"])
    assert t.check("12 MiB").correct


def test_computed_question_checks_against_minialloc():
    s = session(["c2-computed-oom"], seed="x")
    right = answer_of(s, "c2-computed-oom")
    assert s.check(right + 2).status == "wrong"
    fb = s.check(str(right))
    assert fb.correct and str(int(right)) in fb.explanation  # the explanation is filled with this drawing's numbers


@pytest.mark.parametrize(("text", "value"), [
    ("20", 20.0), (" 1.5 ", 1.5), ("1,5", 1.5), ("20 MiB", 20.0), ("1 536", 1536.0), ("-3", -3.0), (7, 7.0),
    ("abc", None), ("", None), ("1,2,3", None), (True, None), (float("nan"), None), ("inf", None),
])
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_feedback_follows_the_language():
    s = session(["c2-5gb-2gb"])
    s.check(wrong_option(s))
    s.check(wrong_option(s))  # the second try opens the explanation
    for lang in LANGS:
        s.set_lang(lang)
        fb = s.feedback("c2-5gb-2gb")
        assert fb.message == UI["wrong"][lang]
        assert fb.explanation == BANK["c2-5gb-2gb"].explanation[lang]
    with pytest.raises(ValueError, match="unknown language"):
        s.set_lang("fr")


def test_shuffle_is_deterministic_by_seed():
    ids = [q.id for q in BANK.chapter(1)]

    def layout(seed):
        s = session(ids, seed=seed)
        return [(i.qid, [oid for oid, _ in i.options]) for i in s.items]

    assert layout(5) == layout(5)
    assert layout(5) != layout(6)
    assert [qid for qid, _ in layout(5)] != ids or [qid for qid, _ in layout(6)] != ids  # it does shuffle


def test_retry_gives_a_new_round():
    ids = [q.id for q in BANK.chapter(2)]
    s = session(ids, seed=9)
    s.check(answer_of(s, s.current.qid))
    first = [(i.qid, i.options, i.exhibit) for i in s.items]
    s.retry()
    assert (s.round, s.score, s.answered, s.state.index) == (1, 0, 0, 0)
    assert [(i.qid, i.options, i.exhibit) for i in s.items] != first


def test_limit_asks_fewer_questions():
    s = PracticeSession(BANK.chapter(1), seed=2, limit=3)
    assert s.total == 3


# -- the student's copy holds no answer in clear ------------------------------------------------------------------

def test_payload_holds_no_answer_in_clear():
    ids = [q.id for q in BANK]
    s = session(ids, seed=11)
    text = s.payload.to_json()
    assert '"answer"' not in text and '"tolerance"' not in text and '"correct"' not in text
    for item in s.items:
        q = BANK[item.qid]
        rendered = q.render(f"{s.seed}|{s.round}")
        for lang in LANGS:
            assert rendered.explanation[lang] not in text, f"{item.qid}: explanation in clear"
        if q.kind in ("numeric", "computed"):
            assert f'"answer": {json.dumps(rendered.answer)}' not in text
        # the answer is there, sealed, and opens to the right value
        key = unseal(item.key, s.payload.salt, f"{item.qid}|key")
        want = sorted(rendered.answer) if isinstance(rendered.answer, frozenset) else rendered.answer
        assert key["answer"] == want


def test_sealing_hides_and_restores():
    salt = b"0123456789abcdef"
    token = seal({"answer": "b"}, salt, "q|key")
    assert "answer" not in token and '"b"' not in token
    assert unseal(token, salt, "q|key") == {"answer": "b"}
    assert seal({"answer": "b"}, salt, "other|key") != token  # the same answer looks different elsewhere
    with pytest.raises(ValueError):
        unseal(token, salt, "other|key")
    with pytest.raises(ValueError):
        unseal("plain text", salt, "q|key")


def test_saved_widget_output_holds_no_answer():
    quiz = quizzes.practice(ids=["c2-5gb-2gb"], seed=4, mode="widget")
    bundle = json.dumps(quiz._repr_mimebundle_(), ensure_ascii=False)
    assert BANK["c2-5gb-2gb"].explanation["en"] not in bundle


# -- the widget ------------------------------------------------------------------------------------------------------

def test_widget_wrong_then_right_and_next():
    quiz = quizzes.practice(ids=["c2-5gb-2gb", "c1-eleven-mib"], seed=3, mode="widget")
    assert isinstance(quiz, PracticeQuiz)
    s = quiz.session
    first = s.current.qid
    if first != "c2-5gb-2gb":  # make the order of this test independent of the shuffle
        s.next()
        quiz._show()
    quiz._choice.value = wrong_option(s)
    quiz._check.click()
    assert UI["wrong"]["en"] in quiz._feedback.value and 'aria-live="polite"' in quiz._feedback.value
    explanation = BANK["c2-5gb-2gb"].explanation["en"][:40]
    assert explanation not in quiz._feedback.value  # not after the first miss: the retry must still count
    assert not quiz._next.disabled
    quiz._choice.value = answer_of(s, "c2-5gb-2gb")
    quiz._check.click()
    assert UI["correct"]["en"] in quiz._feedback.value and explanation in quiz._feedback.value
    assert "0/1" in quiz._progress.value


def test_widget_number_field_submits_on_enter():
    quiz = quizzes.practice(ids=["c1-eleven-mib"], seed=3, mode="widget")
    quiz._number.value = "12"
    quiz._on_text_msg(quiz._number, {"event": "submit"}, [])  # what ipywidgets 8 sends on Enter
    assert UI["correct"]["en"] in quiz._feedback.value
    quiz.go_next()
    assert quiz.session.finished and "1" in quiz._feedback.value and quiz._check.disabled
    quiz.restart()
    assert not quiz.session.finished and quiz._feedback.value == "" and quiz.session.round == 1


def test_widget_language_switch_keeps_the_selection():
    quiz = quizzes.practice(ids=["c2-5gb-2gb"], seed=3, mode="widget")
    chosen = wrong_option(quiz.session)
    quiz._choice.value = chosen
    quiz._check.click()
    quiz._check.click()  # a second try: the explanation is open now
    quiz._lang.value = "vi"
    q = BANK["c2-5gb-2gb"]
    assert q.text["vi"] in quiz._question.value
    labels = dict((value, label) for label, value in quiz._choice.options)
    assert labels == {o.id: o.text["vi"] for o in q.options}
    assert quiz._choice.value == chosen
    assert UI["wrong"]["vi"] in quiz._feedback.value and q.explanation["vi"][:40] in quiz._feedback.value
    assert quiz._check.description == UI["check"]["vi"]
    quiz._lang.value = "de"
    assert q.text["de"] in quiz._question.value


def test_widget_says_to_rerun_its_cell_after_a_reopen():
    # saved widget state redraws the quiz in a reopened notebook, but its buttons need a kernel: its last line
    # says so, in the quiz's language, through every state the saved view can be in (a question, the score)
    quiz = quizzes.practice(ids=["c1-eleven-mib"], seed=3, mode="widget")
    assert quiz.children[-1] is quiz._rerun
    for lang in ("en", "vi", "de"):
        quiz._lang.value = lang
        assert html.escape(UI["rerun"][lang]) in quiz._rerun.value
    quiz._number.value = "12"
    quiz.submit()
    quiz.go_next()
    assert quiz.session.finished and html.escape(UI["rerun"]["de"]) in quiz._rerun.value


def test_widget_many_choice_boxes():
    quiz = quizzes.practice(ids=["c2-empty-cache"], seed=3, mode="widget")
    right = set(answer_of(quiz.session, "c2-empty-cache"))
    for oid, box in zip(quiz._option_ids(), quiz._boxes, strict=True):
        box.value = oid in right
    assert quiz.submit().correct


def test_text_output_for_nbconvert():
    quiz = quizzes.practice(ids=["c2-5gb-2gb", "c2-computed-summary"], seed=3, mode="widget")
    plain = quiz._repr_mimebundle_()["text/plain"]
    assert BANK["c2-5gb-2gb"].text["en"] in plain and "GPU reserved memory" in plain
    assert "application/vnd.jupyter.widget-view+json" in quiz._repr_mimebundle_()


def test_practice_api():
    text = quizzes.practice(chapter=4, lang="de", seed=1)  # outside a kernel: text
    assert isinstance(text, quizzes.TextQuiz)
    assert "Kapitel 4" in str(text) and "Paging" in str(text)
    assert str(quizzes.practice(chapter=[5, 6], mode="text")).count("\n1. ") == 1
    with pytest.raises(ValueError, match="no questions for chapter 99"):
        quizzes.practice(chapter=99)
    with pytest.raises(KeyError, match="no question 'nope'"):
        quizzes.practice(ids=["nope"])
    with pytest.raises(ValueError, match="mode"):
        quizzes.practice(chapter=1, mode="gui")


def test_text_rendering_letters_options_and_hides_answers():
    s = session(["c2-empty-cache", "c1-eleven-mib"], lang="vi")
    out = render_text(s)
    assert "A) " in out and "E) " in out and UI["select_all"]["vi"] in out and "Trả lời bằng MiB" in out
    assert BANK["c2-empty-cache"].explanation["vi"] not in out


def test_practice_by_tag_is_the_course_pages_quiz():
    quiz = quizzes.practice(tag="faq", mode="text", seed=3)
    faq = {q.id for q in BANK if "faq" in q.tags}
    assert len(faq) == 5 and {i.qid for i in quiz.session.items} == faq
    assert str(quiz).startswith("The course page's own quiz")
    vi = quizzes.practice(tag="faq", mode="text", seed=3, lang="vi")
    assert str(vi).startswith("Bài kiểm tra của chính trang khóa học")
    with pytest.raises(ValueError, match="no questions tagged 'nope'"):
        quizzes.practice(tag="nope", mode="text")
