"""English sentences left in what a translated notebook shows: the words a learner reads that nobody translated.

A sentence, here, is a run of at least ``MIN_RUN`` consecutive words from ``COMMON``, a list of everyday English
words (function words and the plain verbs and nouns the course's messages are made of). One or two such words
in a row are not a sentence: a code name (``best fit``, ``as_recorded``), a unit or a term the translations keep
in English (trace, batch, tensor, kernel) reads as a word of the other language. The German words English
spells the same way and German uses most ("die", "was", "also") are left out of ``COMMON``; the others (in, so,
an English "to" that is Vietnamese for "big") do not come three in a row in a German or Vietnamese sentence.

``allow`` holds what may stay English: literal phrases and regular expressions (PyTorch's own OOM message and
``memory_summary()``, which a learner meets byte for byte in real life). Each match is cut out before the scan and
breaks the run it stood in.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterable, Mapping

MIN_RUN = 3

COMMON: frozenset[str] = frozenset("""
a about above across address after again against all allocate allocated allocation allocations almost alone along
already always am among and another any anything are around as ask asked asks at away back be because become been
before began begin being below best between big block blocks both but by bytes call called can cannot case cell
change check checked come could count day device devices did different does done down during each early either else
empty end enough entries entry even ever every exactly fail failed fails failure failures few first fits for found
free freed from full gave get gets give given go goes going gone good got had has have he held help her here high
higher him his hold holds how if in into is it its just keep keeps kept know large larger largest last later least
leave left less let like limit little live long look lot low lower made make makes many mark marked may me memory
might more most much must my need needs never new next no none nor not nothing now of off often old on once one only
or other others our out over own part past peak peaks place placed places please pool read reason record recorded
request requested reserved right run runs same saves say says see seen segment segments set settings shall she
should show shown side since small smaller smallest so some something start state still such take than that the
their them then there these they thing this those though through time to too tried try under until up upon us use
used uses very want wanted was way we well went were what when where whether which while who whole wholly why with
within without would yet you your
""".split()) - {"was", "also"}  # German homographs kept out even if a later edit adds them

_BREAK = "\x00"  # stands where an allowed phrase was cut out: no word, so it ends a run
_OPTION = re.compile(r"\(?[A-Da-d]\)")
_EDGE = "()[]{}<>.,;:!?\"'`*“”‘’«»„"


def _word(token: str) -> str | None:
    """The token as a lower-case English word from COMMON, or None (a number, a code name, another language)."""
    if _OPTION.fullmatch(token):
        return None  # a multiple-choice option's letter, "A)"
    core = token.strip(_EDGE)
    if not core or not core.isascii() or not core.replace("'", "").isalpha():
        return None  # digits, underscores, dots or slashes inside: code, a path or a size, not prose
    word = core.lower()
    return word if word in COMMON else None


def english_sentences(text: str, allow: Iterable[str | re.Pattern[str]] = ()) -> list[str]:
    """Every run of at least MIN_RUN consecutive common English words in ``text``, once each, in order, after
    cutting out each ``allow`` entry (a str is a literal phrase, a compiled pattern a regular expression)."""
    for entry in allow:
        pattern = entry if isinstance(entry, re.Pattern) else re.compile(re.escape(entry))
        text = pattern.sub(f" {_BREAK} ", text)
    found: list[str] = []
    run: list[str] = []

    def close() -> None:
        if len(run) >= MIN_RUN:
            sentence = " ".join(run).strip(_EDGE)
            if sentence not in found:
                found.append(sentence)
        run.clear()

    for token in text.split():
        if _word(token) is None:
            close()
        else:
            run.append(token)
    close()
    return found


def learner_texts(cells: Iterable[Mapping]) -> list[tuple[int, str]]:
    """(cell index, text) for what a learner reads in executed code cells' outputs: printed text, displayed results
    (their HTML or Markdown as words without tags, else their plain text; a picture's placeholder is skipped, its
    words are checked where it is drawn), and error messages but those of Python's built-in exceptions (NameError,
    NotImplementedError: Python's English, as PyTorch's message is PyTorch's). An AssertionError's message is the
    notebook's own check, and is read."""
    texts = []
    for n, cell in enumerate(cells):
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            kind = out.get("output_type")
            if kind == "stream":
                texts.append((n, out.get("text", "")))
            elif kind in ("execute_result", "display_data"):
                data = out.get("data", {})
                if data.get("text/plain", "").startswith(("<Figure", "<IPython")) and not data.get("text/html"):
                    continue
                shown = data.get("text/html") or data.get("text/markdown") or data.get("text/plain", "")
                texts.append((n, re.sub(r"<[^>]+>", " ", shown)))
            elif kind == "error":
                python_own = isinstance(getattr(builtins, out.get("ename", ""), None), type)
                if not python_own or out.get("ename") == "AssertionError":
                    texts.append((n, f"{out.get('ename')}: {out.get('evalue')}"))
    return texts
