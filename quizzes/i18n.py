"""The three languages of the course and every string the quiz tools show around the questions.

Question text lives in the bank (quizzes/bank/*.json); this module holds the interface around it: buttons,
feedback, progress, the printed certificate. Every entry has all of LANGS, which tests/test_quiz_bank.py checks.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping

LANGS: tuple[str, ...] = ("en", "vi", "de")
LANG_NAMES: dict[str, str] = {"en": "English", "vi": "Tiếng Việt", "de": "Deutsch"}

UI: dict[str, dict[str, str]] = {
    "title": {
        "en": "Practice quiz",
        "vi": "Bài luyện tập",
        "de": "Übungsquiz",
    },
    "title_chapter": {
        "en": "Practice quiz: chapter {chapter}",
        "vi": "Bài luyện tập: chương {chapter}",
        "de": "Übungsquiz: Kapitel {chapter}",
    },
    "check": {"en": "Check", "vi": "Kiểm tra", "de": "Prüfen"},
    "next": {"en": "Next question", "vi": "Câu tiếp theo", "de": "Nächste Frage"},
    "finish": {"en": "See my score", "vi": "Xem điểm", "de": "Ergebnis anzeigen"},
    "retry": {"en": "Start again", "vi": "Làm lại từ đầu", "de": "Von vorn beginnen"},
    "language": {"en": "Language", "vi": "Ngôn ngữ", "de": "Sprache"},
    "rerun": {  # the quiz's last line: a reopened notebook shows the saved quiz, but no kernel answers its buttons
        "en": "The buttons need this notebook's kernel: after reopening the notebook, run this cell again.",
        "vi": "Các nút cần kernel của notebook này: sau khi mở lại notebook, hãy chạy lại ô này.",
        "de": "Die Schaltflächen brauchen den Kernel dieses Notebooks: Führen Sie diese Zelle nach dem erneuten "
              "Öffnen des Notebooks noch einmal aus.",
    },
    "your_answer": {"en": "Your answer", "vi": "Câu trả lời", "de": "Ihre Antwort"},
    "correct": {"en": "Correct.", "vi": "Chính xác.", "de": "Richtig."},
    "wrong": {
        "en": "Not quite. You can change your answer and check again.",
        "vi": "Chưa đúng. Bạn có thể sửa câu trả lời và kiểm tra lại.",
        "de": "Nicht ganz. Sie können Ihre Antwort ändern und erneut prüfen.",
    },
    "choose_one": {
        "en": "Choose an answer first.",
        "vi": "Hãy chọn một đáp án trước.",
        "de": "Bitte wählen Sie zuerst eine Antwort.",
    },
    "choose_many": {
        "en": "Tick at least one answer first.",
        "vi": "Hãy đánh dấu ít nhất một đáp án trước.",
        "de": "Bitte kreuzen Sie zuerst mindestens eine Antwort an.",
    },
    "not_a_number": {
        "en": "Please type a number, for example 20 or 1.5.",
        "vi": "Hãy nhập một con số, ví dụ 20 hoặc 1,5.",
        "de": "Bitte geben Sie eine Zahl ein, zum Beispiel 20 oder 1,5.",
    },
    "select_all": {
        "en": "Select all that apply.",
        "vi": "Chọn tất cả các đáp án đúng.",
        "de": "Wählen Sie alle zutreffenden Antworten.",
    },
    "answer_in": {"en": "Answer in {unit}.", "vi": "Trả lời bằng {unit}.", "de": "Antwort in {unit}."},
    "enter_hint": {
        "en": "Type a number and press Enter, or use the Check button.",
        "vi": "Nhập một con số rồi nhấn Enter, hoặc bấm nút Kiểm tra.",
        "de": "Zahl eingeben und Enter drücken oder „Prüfen“ wählen.",
    },
    "progress": {
        "en": "Question {i} of {n} · first-try score {score}/{answered}",
        "vi": "Câu {i}/{n} · điểm lần thử đầu {score}/{answered}",
        "de": "Frage {i} von {n} · beim ersten Versuch richtig: {score}/{answered}",
    },
    "done": {
        "en": "Finished: {score} of {n} right at the first try. Start again for new numbers and a new order.",
        "vi": "Hoàn thành: đúng {score}/{n} câu ngay lần đầu. Làm lại để có số liệu mới và thứ tự mới.",
        "de": "Fertig: {score} von {n} beim ersten Versuch richtig. Neu beginnen für neue Zahlen und neue "
              "Reihenfolge.",
    },
    "text_mode": {
        "en": "Interactive quiz: open this notebook in JupyterLab to answer with instant feedback.",
        "vi": "Bài trắc nghiệm tương tác: mở notebook này trong JupyterLab để trả lời và nhận phản hồi ngay.",
        "de": "Interaktives Quiz: Öffnen Sie dieses Notebook in JupyterLab, um mit sofortigem Feedback zu "
              "antworten.",
    },
    "question": {"en": "Question", "vi": "Câu hỏi", "de": "Frage"},
    "points": {"en": "points", "vi": "điểm", "de": "Punkte"},
    "point": {"en": "point", "vi": "điểm", "de": "Punkt"},
}

# The printable certificate's wording; {name}, {course}, {date}, {score} are filled in by quizzes.certs.printable.
CERT: dict[str, dict[str, str]] = {
    "heading": {"en": "Certificate of achievement", "vi": "Chứng nhận hoàn thành", "de": "Leistungszertifikat"},
    "awarded": {"en": "awarded to", "vi": "trao cho", "de": "verliehen an"},
    "for_passing": {
        "en": "for passing the graded quiz of the course",
        "vi": "vì đã vượt qua bài kiểm tra có chấm điểm của khóa học",
        "de": "für das Bestehen des benoteten Quiz des Kurses",
    },
    "score": {"en": "Score: {score}", "vi": "Điểm: {score}", "de": "Ergebnis: {score}"},
    "date": {"en": "Date: {date}", "vi": "Ngày: {date}", "de": "Datum: {date}"},
    "issuer": {"en": "Issued by {issuer}", "vi": "Cấp bởi {issuer}", "de": "Ausgestellt von {issuer}"},
    "verification_id": {"en": "Verification ID", "vi": "Mã xác minh", "de": "Prüfnummer"},
    "how_to_verify": {
        "en": "Check it offline with: python -m quizzes verify {file}",
        "vi": "Kiểm tra ngoại tuyến bằng lệnh: python -m quizzes verify {file}",
        "de": "Offline prüfen mit: python -m quizzes verify {file}",
    },
}


def check_lang(lang: str) -> str:
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r}: use one of {', '.join(LANGS)}")
    return lang


def ui(key: str, lang: str, **values: object) -> str:
    """One interface string in `lang`, with {placeholders} filled."""
    return UI[key][check_lang(lang)].format(**values)


def pick(text: Mapping[str, str], lang: str) -> str:
    """The `lang` entry of a {"en": ..., "vi": ..., "de": ...} text."""
    return text[check_lang(lang)]


_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")


def to_html(text: str) -> str:
    """The bank's tiny markup as HTML: `code`, **bold** and line breaks; everything else is escaped."""
    out = html.escape(text, quote=False)
    out = _CODE.sub(r"<code>\1</code>", out)
    out = _BOLD.sub(r"<b>\1</b>", out)
    return out.replace("\n", "<br>")


def to_plain(text: str) -> str:
    """The bank's markup for a terminal or a text/plain output: bold markers dropped, `code` kept."""
    return _BOLD.sub(r"\1", text)
