"""Cut a notebook cell into the units a translator translates, and put translations back in their place.

Markdown cells: one unit per paragraph, heading, list item, block quote and table row, with a paragraph's
hard-wrapped lines joined into one line (so rewrapping the English changes nothing). Fenced code blocks, ``$$``
formulas, HTML comments and lines without a letter stay as they are. A unit keeps its heading hashes, list
marker and quote sign out of the text, so a translator cannot break the structure.

Code cells: only what is written for the learner.

- ``#`` comments. Consecutive full-line comments at one column are one unit (rewrapped on build); a trailing
  comment is its own unit. Pragmas (``noqa``, ``type:``, ``pragma``, ``fmt:``), nbgrader markers (``### BEGIN``)
  and the i18n markers below are never translated.
- String literals (plain or f-strings; implicit concatenation is one unit) that are positional arguments of
  ``print``, the explanation of ``learn.reveal`` (4th argument, or ``why=``), the keyword arguments ``title``,
  ``xlabel``, ``ylabel``, ``caption``, ``hint``, ``why``, and docstrings (a learner reads an exercise's).
- The values of a message table, a dict literal assigned to the name ``MESSAGES`` (a lab's setup cell holds one,
  so that its graded test cells, identical in every language, say ``MESSAGES["key"].format(...)`` in the lab's
  language); its keys stay as written.
- Explicit markers: a string literal on a line ending with the comment ``# i18n`` is translated whatever it is
  passed to; a line ending with ``# i18n: off`` keeps its strings and comment in English.

An f-string's unit is its text with the replacement fields written as in the source (``{len(table)}``): a
translation must keep every field, which ``fields`` lets the check compare. Identifiers, API names and outputs
are never units, and cells with a cell magic (``%%``) are left alone.
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from collections.abc import Callable
from dataclasses import dataclass

WIDTH = 116  # the course's notebooks wrap prose and code at about this width
LEARNER_KEYWORDS = frozenset({"title", "xlabel", "ylabel", "caption", "hint", "why"})
MESSAGE_TABLE = "MESSAGES"  # a dict literal bound to this name: its values are learner-facing (see the module doc)
_PRAGMA = re.compile(r"^\s*(noqa\b|type:|pragma\b|fmt:|pylint:|i18n\b)", re.I)
_NBGRADER = re.compile(r"^#+\s*(BEGIN|END) (SOLUTION|HIDDEN TESTS)")
_MARK_ON = re.compile(r"#\s*i18n\s*$")
_MARK_OFF = re.compile(r"#\s*i18n:\s*off\s*$")
_LETTER = re.compile(r"[^\W\d_]")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(\s{0,3}#{1,6}\s+)(.*?)\s*$")
_ITEM = re.compile(r"^(\s*(?:[-*+]|\d+[.)])\s+)(.*)$")
_QUOTE = re.compile(r"^(\s*>\s?)(.*)$")
_TABLE_SEP = re.compile(r"^\s*\|?[\s:|-]+\|[\s:|-]*$")


@dataclass(frozen=True)
class Unit:
    """One translatable piece of a cell: its English text, what kind of text it is, where it sits in the cell's
    source (``start:end``, character offsets) and how a translation is written there."""

    text: str
    kind: str
    start: int
    end: int
    render: Callable[[str, int], str]  # (translation, the column where it starts) -> source text


def has_letter(text: str) -> bool:
    return bool(_LETTER.search(text))


# ---------------------------------------------------------------- markdown


def _line_offsets(lines: list[str]) -> list[int]:
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line)
    offsets.append(pos)
    return offsets


def _block_start(line: str) -> bool:
    """Does this line start a block of its own (so that it ends the paragraph before it)?"""
    return bool(_FENCE.match(line) or _HEADING.match(line) or _ITEM.match(line) or line.lstrip().startswith(("|", "$$",
                                                                                                            "<!--")))


def markdown_units(source: str) -> list[Unit]:
    lines = source.splitlines(keepends=True)
    at = _line_offsets(lines)
    units: list[Unit] = []

    def add(kind: str, first: int, last: int, prefix: str, text: str, trailing: str) -> None:
        text = text.strip()
        if not has_letter(text):
            return
        units.append(Unit(text, kind, at[first], at[last + 1] - len(trailing),
                          lambda tr, col, p=prefix: p + tr))

    i, n = 0, len(lines)
    while i < n:
        raw = lines[i]
        line = raw.rstrip("\r\n")
        ending = raw[len(line):]
        stripped = line.strip()
        if not stripped:
            i += 1
        elif _FENCE.match(line):  # fenced code: kept whole, up to the closing fence
            fence = _FENCE.match(line).group(1)
            i += 1
            while i < n and not lines[i].strip().startswith(fence):
                i += 1
            i += 1
        elif stripped.startswith("$$"):  # display math: kept whole
            closed = stripped != "$$" and stripped.endswith("$$") and len(stripped) > 3
            i += 1
            while not closed and i < n:
                closed = "$$" in lines[i]
                i += 1
        elif stripped.startswith("<!--"):
            while i < n and "-->" not in lines[i]:
                i += 1
            i += 1
        elif (m := _HEADING.match(line)) and not line.lstrip().startswith("#!"):
            add("markdown heading", i, i, m.group(1), m.group(2), ending)
            i += 1
        elif stripped.startswith("|"):
            if not _TABLE_SEP.match(line):
                lead = line[: len(line) - len(line.lstrip())]
                add("markdown table row", i, i, lead, stripped, ending)
            i += 1
        elif m := _ITEM.match(line):
            first, parts = i, [m.group(2)]
            i += 1
            while i < n and lines[i].strip() and not _block_start(lines[i]):
                parts.append(lines[i].strip())
                i += 1
            add("markdown list item", first, i - 1, m.group(1), " ".join(parts), _ending(lines[i - 1]))
        elif m := _QUOTE.match(line):
            first, parts = i, []
            prefix = m.group(1)
            while i < n and (q := _QUOTE.match(lines[i].rstrip("\r\n"))):
                parts.append(q.group(2).strip())
                i += 1
            add("markdown quote", first, i - 1, prefix, " ".join(parts), _ending(lines[i - 1]))
        else:
            first, parts = i, [stripped]
            i += 1
            while i < n and lines[i].strip() and not _block_start(lines[i]) and not _QUOTE.match(lines[i]):
                parts.append(lines[i].strip())
                i += 1
            lead = line[: len(line) - len(line.lstrip())]
            add("markdown paragraph", first, i - 1, lead, " ".join(parts), _ending(lines[i - 1]))
    return units


def _ending(raw: str) -> str:
    return raw[len(raw.rstrip("\r\n")):]


# ---------------------------------------------------------------- code


def _mask_magics(source: str) -> str:
    """IPython line magics and shell escapes (``%time``, ``!ls``) as ``pass``, so the cell parses as Python with
    every other line where it was."""
    out = []
    for line in source.splitlines(keepends=True):
        body = line.lstrip()
        if body.startswith(("%", "!")):
            indent = line[: len(line) - len(body)]
            out.append(indent + "pass" + _ending(line))
        else:
            out.append(line)
    return "".join(out)


def _char_col(line: str, byte_col: int) -> int:
    """ast counts columns in UTF-8 bytes; the source is cut in characters."""
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))


_PIECE = re.compile(r"([rRbBuUfF]{0,2})(\"\"\"|\'\'\'|\"|\')")


def _source_fstring_text(raw: str) -> str | None:
    """An implicitly concatenated f-string's text, fields exactly as written in ``raw`` (its source); None when
    the source holds anything this reader does not know (then the fields come from ast.unparse)."""
    out, pos = [], 0
    while pos < len(raw):
        if raw[pos].isspace():
            pos += 1
            continue
        m = _PIECE.match(raw, pos)
        if not m or "b" in m.group(1).lower():
            return None
        prefix, quote = m.group(1).lower(), m.group(2)
        pos = m.end()
        literal: list[str] = []
        while True:
            if pos >= len(raw):
                return None
            if raw.startswith(quote, pos):
                pos += len(quote)
                break
            ch = raw[pos]
            if ch == "\\" and "r" not in prefix:
                literal.append(raw[pos:pos + 2])
                pos += 2
            elif "f" in prefix and raw.startswith(("{{", "}}"), pos):
                literal.append(raw[pos:pos + 2])
                pos += 2
            elif "f" in prefix and ch == "{":
                if not _flush_literal(literal, prefix, quote, out):
                    return None
                depth, start = 0, pos
                while pos < len(raw):
                    if raw[pos] in "{[(":
                        depth += 1
                    elif raw[pos] in "}])":
                        depth -= 1
                        if depth == 0:
                            break
                    elif raw[pos] in "\"'":  # a string inside a field: skipped whole
                        if raw[pos] == quote[0]:
                            return None  # Python 3.12's reuse of the outer quote: left to ast.unparse
                        end = raw.find(raw[pos], pos + 1)
                        if end < 0:
                            return None
                        pos = end
                    pos += 1
                out.append(raw[start:pos + 1])
                pos += 1
            else:
                literal.append(ch)
                pos += 1
        if not _flush_literal(literal, prefix, quote, out):
            return None
    return "".join(out)


def _flush_literal(literal: list[str], prefix: str, quote: str, out: list[str]) -> bool:
    """Decode the literal text gathered so far (escapes and all) onto ``out``; False when it does not decode."""
    if literal:
        try:
            value = ast.literal_eval(prefix.replace("f", "") + quote + "".join(literal) + quote)
        except (SyntaxError, ValueError):
            return False
        out.append(value if "f" in prefix else value.replace("{", "{{").replace("}", "}}"))
        literal.clear()
    return True


def _fstring_text(node: ast.JoinedStr) -> str:
    """An f-string as a translator sees it: literal text with braces doubled, fields as in the source."""
    out = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            out.append(str(part.value).replace("{", "{{").replace("}", "}}"))
        elif isinstance(part, ast.FormattedValue):
            field = ast.unparse(part.value)
            if field.startswith("{"):
                field = " " + field  # "{{" would read as an escaped brace
            if part.conversion != -1:
                field += "!" + chr(part.conversion)
            if part.format_spec is not None:
                field += ":" + _fstring_text(part.format_spec)
            out.append("{" + field + "}")
    return "".join(out)


_FIELD = re.compile(r"\{\{|\}\}|\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")


def fields(text: str) -> list[str]:
    """The replacement fields of an f-string unit, in order (escaped braces are not fields)."""
    return sorted(m.group(0) for m in _FIELD.finditer(text) if m.group(0) not in ("{{", "}}"))


def _escape(text: str, quote: str) -> str:
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == quote:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 32:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def _atoms(text: str, is_f: bool) -> list[tuple[str, bool]]:
    """(piece, is_field): an f-string's fields are never cut or escaped."""
    if not is_f:
        return [(ch, False) for ch in text]
    atoms, pos = [], 0
    for m in _FIELD.finditer(text):
        atoms.extend((ch, False) for ch in text[pos:m.start()])
        atoms.append((m.group(0), m.group(0) not in ("{{", "}}")))
        pos = m.end()
    atoms.extend((ch, False) for ch in text[pos:])
    return atoms


def string_literal(text: str, is_f: bool, column: int, width: int = WIDTH, bracketed: bool = True) -> str:
    """A Python expression for ``text``: one literal, or implicitly concatenated literals on lines starting at
    ``column``. Inside a call's parentheses (``bracketed``) the lines continue implicitly; elsewhere several lines
    are put in parentheses."""
    atoms = _atoms(text, is_f)
    field_code = "".join(a for a, f in atoms if f)
    quote = "'" if ('"' in field_code or ('"' in text and "'" not in text)) else '"'
    room = max(40, width - column - 4)
    words: list[list[tuple[str, bool]]] = [[]]  # each word with the spaces after it, so lines end in a space
    for k, (atom, is_field) in enumerate(atoms):
        words[-1].append((atom, is_field))
        nxt = atoms[k + 1][0] if k + 1 < len(atoms) else ""
        if atom == " " and nxt != " ":
            words.append([])
    chunks: list[list[tuple[str, bool]]] = [[]]
    size = 0
    for word in words:
        length = sum(len(a) if f else len(_escape(a, quote)) for a, f in word)
        if chunks[-1] and size + length > room:
            chunks.append([])
            size = 0
        chunks[-1].extend(word)
        size += length
    literals = []
    for chunk in chunks:
        if not chunk:
            continue
        needs_f = is_f and any(f or a in ("{{", "}}") for a, f in chunk)
        parts = []
        for atom, is_field in chunk:
            if is_field:
                parts.append(atom)
            elif atom in ("{{", "}}"):  # an escaped brace stays escaped only inside an f-string
                parts.append(atom if needs_f else atom[0])
            else:
                parts.append(_escape(atom, quote))
        body = "".join(parts)
        literals.append(("f" if needs_f else "") + quote + body + quote)
    if not literals:
        literals = [quote + quote]
    if len(literals) > 1 and not bracketed:
        return "(" + ("\n" + " " * (column + 1)).join(literals) + ")"
    return ("\n" + " " * column).join(literals)


def _docstring_literal(text: str, quote: str, column: int) -> str:
    paragraphs = text.split("\n\n")
    width = max(40, WIDTH - column)
    lines: list[str] = []
    for k, para in enumerate(paragraphs):
        if k:
            lines.append("")
        lines.extend(textwrap.wrap(para, width) or [""])
    body = "\n".join((" " * column + line) if k and line else line for k, line in enumerate(lines))
    body = body.replace("\\", "\\\\").replace(quote, "\\" + quote)  # only what would end the docstring
    if body.endswith(quote[0]):
        body = body[:-1] + "\\" + quote[0]
    return quote + body + quote


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _learner_strings(tree: ast.AST, marked_on: set[int]) -> dict[int, tuple[ast.expr, str]]:
    """id(node) -> (node, kind) for every string literal the learner reads."""
    found: dict[int, tuple[ast.expr, str]] = {}

    def take(node: ast.expr, kind: str) -> None:
        if _is_text(node):
            found.setdefault(id(node), (node, kind))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name == "print":
                for arg in node.args:
                    take(arg, "code string (print)")
            if name == "reveal" and len(node.args) >= 4:
                take(node.args[3], "code string (reveal's explanation)")
            for kw in node.keywords:
                if kw.arg in LEARNER_KEYWORDS:
                    take(kw.value, f"code string ({kw.arg}=)")
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == MESSAGE_TABLE for t in targets):
                for value in node.value.values:
                    take(value, "code string (MESSAGES)")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found[id(first.value)] = (first.value, "docstring")
        if _is_text(node) and node.lineno in marked_on:
            take(node, "code string (# i18n)")
    return found


def code_units(source: str) -> list[Unit]:
    if source.lstrip().startswith("%%"):
        return []
    masked = _mask_magics(source)
    try:
        tree = ast.parse(masked)
        tokens = list(tokenize.generate_tokens(io.StringIO(masked).readline))
    except (SyntaxError, tokenize.TokenError):
        return []  # not Python: nothing in it is translated
    lines = source.splitlines(keepends=True)
    at = _line_offsets(lines)

    def offset(row: int, col: int) -> int:
        return at[row - 1] + col

    comments = [t for t in tokens if t.type == tokenize.COMMENT]
    marked_on = {t.start[0] for t in comments if _MARK_ON.search(t.string)}
    marked_off = {t.start[0] for t in comments if _MARK_OFF.search(t.string)}
    units: list[Unit] = []

    strings = []
    for node, kind in _learner_strings(tree, marked_on).values():
        if node.lineno in marked_off:
            continue
        start = offset(node.lineno, _char_col(lines[node.lineno - 1], node.col_offset))
        end = offset(node.end_lineno, _char_col(lines[node.end_lineno - 1], node.end_col_offset))
        if any(start <= offset(*t.start) < end for t in comments):
            continue  # a comment between concatenated pieces would be lost: leave this one in English
        column = start - at[node.lineno - 1]
        if kind == "docstring":
            raw = source[start:end]
            quote = raw[-3:] if raw[-3:] in ('"""', "'''") else raw[-1]
            if len(quote) == 1 or raw[:1] in "rRbBuU":
                continue  # a one-quote or prefixed docstring: rare, kept as written
            text = "\n\n".join(" ".join(p.split()) for p in re.split(r"\n\s*\n", node.value.strip()))
            if has_letter(text):
                strings.append(Unit(text, kind, start, end,
                                    lambda tr, col, q=quote, c=column: _docstring_literal(tr, q, c)))
            continue
        is_f = isinstance(node, ast.JoinedStr)
        text = (_source_fstring_text(source[start:end]) or _fstring_text(node)) if is_f else node.value
        if has_letter(text.replace("{{", "").replace("}}", "") if not is_f else _FIELD.sub("", text)):
            # a marked string may stand outside any bracket (x = "..."  # i18n): several lines need parentheses
            strings.append(Unit(text, kind, start, end, lambda tr, col, f=is_f, k=kind: string_literal(
                tr, f, col, bracketed=not k.endswith("(# i18n)"))))

    taken = [(u.start, u.end) for u in strings]
    block: list[tokenize.TokenInfo] = []

    def flush() -> None:
        if not block:
            return
        col = block[0].start[1]
        texts = [_comment_text(t.string) for t in block]
        text = " ".join(x.strip() for x in texts)
        start = offset(*block[0].start)
        end = offset(*block[-1].end)
        units.append(Unit(text, "code comment", start, end, lambda tr, c, at_col=col: _comment_block(tr, at_col)))
        block.clear()

    for tok in comments:
        row, col = tok.start
        body = _comment_text(tok.string)
        pos = offset(row, col)
        skip = (not has_letter(body) or _PRAGMA.match(body) or _NBGRADER.match(tok.string)
                or tok.string.startswith("#!") or row in marked_off or _MARK_ON.search(tok.string)
                or any(s <= pos < e for s, e in taken))
        full_line = not lines[row - 1][:col].strip()
        if skip:
            flush()
            continue
        if not full_line:
            flush()
            units.append(Unit(body.strip(), "code comment (end of line)", pos, offset(*tok.end),
                              lambda tr, col: "# " + tr))
            continue
        starts_own = body[:1].isspace() or bool(re.match(r"(?:[-*+]|\d+[.)])\s", body))
        if block and (block[-1].start[0] != row - 1 or block[-1].start[1] != col or starts_own):
            flush()
        block.append(tok)
    flush()
    units.extend(strings)
    units.sort(key=lambda u: u.start)
    return units


def _comment_text(comment: str) -> str:
    body = comment[1:]
    return body[1:] if body.startswith(" ") else body


def _comment_block(text: str, column: int) -> str:
    width = max(40, WIDTH - column - 2)
    return ("\n" + " " * column).join("# " + line for line in textwrap.wrap(text, width) or [""])


def cell_units(cell_type: str, source: str) -> list[Unit]:
    if cell_type == "markdown":
        return markdown_units(source)
    if cell_type == "code":
        return code_units(source)
    return []


def apply(source: str, units: list[Unit], translations: list[str]) -> str:
    """``source`` with each unit replaced by its rendered translation."""
    out, pos = [], 0
    for unit, tr in zip(units, translations, strict=True):
        out.append(source[pos:unit.start])
        done = "".join(out)
        out = [done, unit.render(tr, len(done) - (done.rfind("\n") + 1))]  # an earlier unit may have moved it
        pos = unit.end
    out.append(source[pos:])
    return "".join(out)


def code_shape(source: str) -> str:
    """The cell's code with every string emptied: a translated cell must have the English cell's shape."""
    tree = ast.parse(_mask_magics(source))

    class Blank(ast.NodeTransformer):
        def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
            return ast.Constant("")

        def visit_Constant(self, node: ast.Constant) -> ast.AST:
            return ast.Constant("") if isinstance(node.value, str) else node

    return ast.dump(Blank().visit(tree))
