"""The quiz bank (``quizzes/bank/*.json``) kept to the course's glossaries.

The bank holds its questions in every language side by side (``{"en": ..., "vi": ..., "de": ...}``), not in a
gettext catalog, so ``python -m course_i18n check`` reads it here: each title, question, option, explanation and
unit is checked against its language's glossary as a message of the code's catalogs is (on its own, so no "first
use" rendering is required; code names such as ``memory_allocated()`` are left alone on both sides). A text written
the same in every language (a setting, a ``memory_summary`` row name) is a literal, not a translation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from . import glossary
from .code import CODE_NAME


def texts(data: dict) -> Iterator[tuple[str, dict[str, str], str]]:
    """(where, {lang: text}, context) for every translated text of one bank file, ``where`` naming question and
    field, ``context`` the English of its whole question (what decides a word's sense, as a notebook paragraph
    does: "requests" in an option of a question about a KV cache are a server's requests)."""
    if isinstance(data.get("title"), dict):
        yield "title", data["title"], str(data["title"].get("en", ""))
    for question in data.get("questions", []):
        qid = question.get("id", "?")
        fields = [(f"{qid}.{field}", question[field]) for field in ("text", "explanation", "unit")
                  if isinstance(question.get(field), dict)]
        fields += [(f"{qid}.options[{option.get('id', '?')}].text", option["text"])
                   for option in question.get("options", []) if isinstance(option.get("text"), dict)]
        context = "\n".join(str(text.get("en", "")) for _, text in fields)
        for where, text in fields:
            yield where, text, context


def check(bank_dir: Path, glossary_path: Callable[[str], Path], langs: Iterable[str]) -> list[str]:
    """Glossary breaches of every bank file in ``bank_dir``; ``glossary_path(lang)`` is the language's glossary.
    Each problem names the file, the question and field, the language and the term."""
    problems: list[str] = []
    for lang in langs:
        path = glossary_path(lang)
        if not path.exists():
            continue
        terms = glossary.load(path)
        every_term = {t.term for t in terms}
        for bank_file in sorted(bank_dir.glob("*.json")):
            try:
                data = json.loads(bank_file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                problems.append(f"{bank_file}: unreadable: {exc}")
                break
            for where, text, context in texts(data):
                english, translation = text.get("en"), text.get(lang)
                if not isinstance(english, str) or not isinstance(translation, str) or translation == english:
                    continue  # a literal; the bank's own loader reports a missing language
                for problem in glossary.violations(CODE_NAME.sub(" ", english), CODE_NAME.sub(" ", translation),
                                                   terms, set(every_term), context=CODE_NAME.sub(" ", context)):
                    problems.append(f"{bank_file}: [{where}] {lang} glossary: {problem}")
    return problems
