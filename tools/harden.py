"""Harden a lab's hidden tests against a student cell that rebinds a locked helper.

    python tools/harden.py labs/source/<lab>/<lab>.ipynb ...

A student cell placed after a locked setup or helper cell can rebind what it defined (`side_by_side = lambda *a:
True`, an import, a constant); hidden tests that look those names up then test the student's stand-in. harden()
puts, at the top of the first test cell that needs them, a hidden copy of the locked cells with every name renamed
`_grader_<name>`, and makes the hidden tests call those copies. The visible tests and the students' release do
not change. tests/test_nbgrader_hostile.py checks that every lab's hidden tests need no hardening (`exposed` is
empty) and grades a rebinding submission.
"""

from __future__ import annotations

import ast
import copy
import json
import re
import sys
from pathlib import Path

import nbformat
from nbformat import NotebookNode

MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
HIDDEN = re.compile(r"(^[ \t]*### BEGIN HIDDEN TESTS[ \t]*\n)(.*?)(^[ \t]*### END HIDDEN TESTS)", re.S | re.M)
HIDDEN_PREFIX = "_grader_"  # the hardened hidden tests' names for their copies of locked names


def meta(cell: NotebookNode) -> dict:
    return cell.metadata.get("nbgrader", {})


def is_test(cell: NotebookNode) -> bool:
    return bool(meta(cell).get("grade")) and not meta(cell).get("solution")


def is_answer(cell: NotebookNode) -> bool:
    return bool(meta(cell).get("solution"))


def is_locked_helper(cell: NotebookNode) -> bool:
    """A locked code cell that is not a test: setup, helpers. A student cell after it can shadow what it defines."""
    return cell.cell_type == "code" and bool(meta(cell).get("locked")) and not meta(cell).get("grade")


# --- Locked names, and the hardening of hidden tests ---------------------------------------------------------------

def bound_names(source: str) -> list[str]:
    """Names a cell binds at its top level: imports, functions, classes, assignments."""
    names: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [a.asname or a.name.split(".")[0] for a in node.names if a.name != "*"]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return list(dict.fromkeys(names))


def shadowable(nb: NotebookNode, student_names: tuple[str, ...] = ()) -> dict[int, list[str]]:
    """Locked helper cell index -> the names it binds that hidden tests must not look up by their public name.

    Names that a test cell or a plain cell binds too (`trace`, `allocator`) are the tests' own variables, bound
    right before use; names the student is meant to fill in (the quiz's `answers`) are the submission itself.
    """
    elsewhere = {name for c in nb.cells if c.cell_type == "code" and not is_locked_helper(c) and not is_answer(c)
                 for name in bound_names(HIDDEN.sub("", c.source))}
    return {i: [n for n in bound_names(c.source) if n not in elsewhere and n not in student_names]
            for i, c in enumerate(nb.cells) if is_locked_helper(c)}


def names_used(code: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}


def exposed(nb: NotebookNode, student_names: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Test cell grade_id -> public names of locked cells that its hidden tests look up (empty when hardened)."""
    helpers = shadowable(nb, student_names)
    out = {}
    for i, cell in enumerate(nb.cells):
        if is_test(cell):
            defined = {n for j, names in helpers.items() if j < i for n in names}
            used = sorted({n for block in HIDDEN.findall(cell.source) for n in names_used(block[1])} & defined)
            if used:
                out[meta(cell)["grade_id"]] = used
    return out


def rename(code: str, mapping: dict[str, str]) -> str:
    """`code` with every name in `mapping` renamed: loads, stores, defs, classes and the names imports bind."""
    tree = ast.parse(code)
    lines = code.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def at(lineno: int, col: int) -> int:  # ast columns count UTF-8 bytes
        return offsets[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode())

    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in mapping:
            start, end = at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)
            if code[start:end] != node.id:  # f-string positions before Python 3.12 can be off: refuse, do not guess
                raise ValueError(f"cannot locate {node.id!r} at line {node.lineno}")
            edits.append((start, end, mapping[node.id]))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in mapping:
            start = at(node.lineno, node.col_offset)
            found = re.compile(rf"(def|class)\s+({re.escape(node.name)})\b").search(code, start)
            edits.append((found.start(2), found.end(2), mapping[node.name]))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = [a.asname or a.name.split(".")[0] for a in node.names]
            if any(b in mapping for b in bound):
                if any("." in a.name and not a.asname for a in node.names if isinstance(node, ast.Import)):
                    raise ValueError(f"cannot rename a dotted import at line {node.lineno}")
                statements = []  # one import per name, so that every line stays short
                for alias, b in zip(node.names, bound, strict=True):
                    one = copy.deepcopy(node)
                    one.names = [ast.alias(alias.name, mapping.get(b, alias.asname))]
                    statements.append(ast.unparse(one))
                indent = "\n" + " " * node.col_offset
                edits.append((at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset),
                               indent.join(statements)))
        elif isinstance(node, ast.arg) and node.arg in mapping:
            raise ValueError(f"parameter {node.arg!r} at line {node.lineno} would shadow a renamed name")
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and set(node.names) & set(mapping):
            raise ValueError(f"global/nonlocal of a renamed name at line {node.lineno}")
    for start, end, text in sorted(edits, reverse=True):
        code = code[:start] + text + code[end:]
    return code


PREAMBLE = ("# The grader's own copy of the locked cells above, under hidden names: a student cell that redefines\n"
            "# a helper, an import or a constant cannot change what the hidden tests below run.\n")


def harden(nb: NotebookNode, student_names: tuple[str, ...] = ()) -> NotebookNode:
    """Make hidden tests independent of names a student can rebind.

    The first test cell whose hidden tests look up a name defined by a locked helper cell (setup, helpers) gets a
    hidden block at its top: a copy of the locked cells before it that no earlier test cell copied, every name
    they bind renamed `_grader_<name>` (imports re-imported under that name). At the top, the copy runs even when
    the cell's visible asserts fail, so later cells can rely on it. The hidden tests then use the `_grader_`
    names; the visible tests stay as they are. harden() of a hardened notebook changes nothing.
    """
    nb = copy.deepcopy(nb)
    if exposed(nb, student_names) and HIDDEN_PREFIX in "".join(c.source for c in nb.cells):
        raise ValueError(f"the notebook already uses names starting with {HIDDEN_PREFIX}: pick another prefix")
    helpers = shadowable(nb, student_names)
    bound = {i: bound_names(c.source) for i, c in enumerate(nb.cells) if is_locked_helper(c)}
    copied: set[int] = set()
    for i, cell in enumerate(nb.cells):
        if not is_test(cell):
            continue
        use = {n: HIDDEN_PREFIX + n for j, names in helpers.items() if j < i for n in names}
        if not any(names_used(body) & set(use) for _, body, _ in HIDDEN.findall(cell.source)):
            continue
        cell.source = HIDDEN.sub(lambda m, use=use: m.group(1) + rename(m.group(2), use) + m.group(3), cell.source)
        todo = [j for j in bound if j < i and j not in copied]
        if todo:
            if any(set(bound[j]) & set(student_names) for j in todo):
                raise ValueError("a locked cell binds a name the student fills in: copying it would reset it")
            everything = {n: HIDDEN_PREFIX + n for j in bound if j < i for n in bound[j]}
            copies = "\n".join(rename(nb.cells[j].source.rstrip() + "\n", everything) for j in todo)
            cell.source = f"### BEGIN HIDDEN TESTS\n{PREAMBLE}{copies}### END HIDDEN TESTS\n{cell.source}"
            copied.update(todo)
    return nb


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python tools/harden.py NOTEBOOK.ipynb...", file=sys.stderr)
        return 2
    for path in map(Path, argv):
        nb = nbformat.read(path, as_version=4)
        before = exposed(nb)
        hardened = harden(nb)
        nbformat.validate(hardened)
        nbformat.write(hardened, path)
        print(f"{path}: hidden tests no longer look up {json.dumps(before)}" if before else f"{path}: unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
