"""Answer cells that look delegated to, or copied: reasons for a person to review, with the evidence; not scores.

Read in the grader's process from the answer cells' text (the student cannot change what this sees):
- names of minialloc's implementation (CachingAllocator, ExpandableSegment, BlockManager, the OOM report...) and
  imports of minialloc beyond what the labs hand out;
- code that makes code at run time (exec, eval, compile, __import__, importlib, marshal, pickle, codecs, zlib,
  base64) or reads the interpreter's view of other code (inspect, linecache, gc, ctypes): the ways to run a
  reference's source under another name, or to read a test's;
- copied code, after `normalised` undoes the mechanical rewrites that keep a program's meaning (every name, the
  formatting and comments, docstrings and `pass`, identity wrappers such as `def same(x): return x` or
  `lambda x: x` around every expression, the order of definitions and imports, and of consecutive assignments
  that do not read each other), compared two ways against every known passage: minialloc's own sources, the
  public solutions (the course's solution notebooks and the labs' source notebooks, both in the public
  repository), and the answers of every other submission of the same batch (collusion):
  1. the syntax-tree comparison: a function whose shape (its syntax tree with every name and constant blanked)
     mostly matches a known function's (SIMILAR of its 8-node shingles);
  2. copydetect (MOSS-style winnowing of token k-grams, names filtered out) on each normalised answer cell
     against each normalised passage: COPYDETECT_SIMILAR of the cell's tokens, at least COPYDETECT_MIN_TOKENS.
A match is a `Copy`, with both passages as written, for the instructor to compare side by side; it flags the
notebook for review and scores nothing. What is not caught: a rewrite that changes the algorithm's structure
(loops turned into recursion, classes into closures), code below MIN_NODES / COPYDETECT_MIN_TOKENS, and a source
the grader does not know.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

# what the labs hand out at grading (grading/labrun.py); every other public name of minialloc is withheld
ALLOWED = frozenset({"SimulatedGPU", "DeviceOutOfMemory", "DeviceError", "DataGPU", "GiB", "KiB", "MiB",
                     "format_size", "parse_size"})
WITHHELD = frozenset({"CachingAllocator", "ExpandableSegment", "BlockManager", "OOMReport", "OutOfMemoryError",
                      "AllocatorConfig", "KVCache", "HostPool", "memory_summary", "get_allocation_size"})
DYNAMIC_CALLS = frozenset({"exec", "eval", "compile", "__import__", "globals", "vars"})
DYNAMIC_MODULES = frozenset({"importlib", "marshal", "pickle", "codecs", "zlib", "base64", "inspect", "linecache",
                             "gc", "ctypes", "runpy", "types"})
SHINGLE = 8  # syntax-tree nodes per shingle
MIN_NODES = 60  # smaller functions are too generic to compare
SIMILAR = 0.75  # share of a function's shingles found in one known function
COPYDETECT_K, COPYDETECT_WINDOW = 25, 4  # copydetect's noise threshold and guarantee threshold (its defaults)
COPYDETECT_SIMILAR = 0.6  # share of an answer cell's tokens found in one known passage
COPYDETECT_MIN_TOKENS = 120  # fewer shared tokens are too generic to call a copy
ROOT = Path(__file__).resolve().parent.parent  # the repository: the public solutions beside the grader
PUBLIC_SOLUTIONS = (ROOT / "course" / "solutions", ROOT / "labs" / "source")
MAX_COPIES = 5  # per answer cell: the closest passages
MAX_NOTEBOOK_BYTES = 10_000_000  # another submission larger than this is not read (intake refuses it anyway)


@dataclass(frozen=True)
class Copy:
    """An answer cell (or one of its functions) that matches a known passage: the evidence, side by side."""

    cell: str  # the answer cell's grade id
    where: str  # whose the passage is: "minialloc's allocator.free", "the public solution ...", "student bob's ..."
    method: str  # "syntax tree" or "copydetect"
    alike: float  # the share of the answer found in the passage
    answer: str  # the answer's passage, as written
    passage: str  # the known passage, as written

    @property
    def reason(self) -> str:
        return f"{self.cell}: alike {self.where} ({self.alike:.0%} by {self.method})"

    def as_json(self) -> dict:
        return {"cell": self.cell, "where": self.where, "method": self.method, "alike": round(self.alike, 3),
                "answer": self.answer, "passage": self.passage}


def copied_work(answers: dict[str, str], others: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
    """Reasons to review, "<answer cell>: <why>", for the answer cells' sources by grade id (`others`: the other
    submissions of the batch, student -> grade id -> source)."""
    reasons, copies = review(answers, others)
    return reasons + [c.reason for c in copies]


def review(answers: dict[str, str], others: Mapping[str, Mapping[str, str]] | None = None,
           boilerplate: Mapping[str, str] | None = None) -> tuple[list[str], list[Copy]]:
    """(reasons that are not copies, the copies found) for the answer cells' sources by grade id. `boilerplate`:
    each answer cell as the release hands it out (the instructor's skeleton, which every student shares): an
    answer that is only that is not compared, and what it shares with it counts for nothing."""
    reasons: list[str] = []
    copies: list[Copy] = []
    known = [*_reference_passages(), *_batch_passages(others or {})]
    for grade_id, source in answers.items():
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue  # it scores nothing anyway
        reasons += [f"{grade_id}: {why}" for why in dict.fromkeys(_names(tree))]
        skeleton = (boilerplate or {}).get(grade_id, "")
        try:
            skeleton_tree = ast.parse(skeleton) if skeleton else None
        except SyntaxError:
            skeleton_tree = None
        if skeleton_tree is not None and ast.dump(normalised(skeleton_tree)) == ast.dump(normalised(tree)):
            continue  # the release's skeleton, unanswered
        copies += _copies(grade_id, source, tree, known, skeleton_tree)
    return reasons, copies


def _names(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top == "minialloc":
                    found.append(f"imports {alias.name}")
                elif top in DYNAMIC_MODULES:
                    found.append(f"imports {top}, which can run or read other code")
        elif isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0]
            if top == "minialloc" and (node.module != "minialloc" or
                                       any(a.name not in ALLOWED for a in node.names)):
                found.append(f"imports from {node.module}")
            elif top in DYNAMIC_MODULES:
                found.append(f"imports {top}, which can run or read other code")
        elif isinstance(node, ast.Name) and node.id in WITHHELD | DYNAMIC_CALLS:
            found.append(f"uses {node.id}" + (" (minialloc's implementation)" if node.id in WITHHELD else ""))
        elif isinstance(node, ast.Attribute) and node.attr in WITHHELD:
            found.append(f"uses .{node.attr} (minialloc's implementation)")
    return found


def shape(node: ast.AST) -> list[str]:
    """The node types of a syntax tree in source order: names, constants and operators' spelling left out."""
    out = [type(node).__name__]
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.expr_context, ast.Load, ast.Store)):
            continue
        out += shape(child)
    return out


def shingles(node: ast.AST) -> set[tuple[str, ...]]:
    nodes = shape(node)
    return {tuple(nodes[i:i + SHINGLE]) for i in range(len(nodes) - SHINGLE + 1)}


@dataclass(frozen=True)
class Passage:
    """A known text: its functions' shingles (normalised) and its normalised text, for both comparisons."""

    where: str
    source: str
    functions: tuple[tuple[str, str, frozenset], ...]  # (name, source as written, shingles)
    fingerprint: object  # copydetect's CodeFingerprint of the normalised text, None when too short


@lru_cache(maxsize=8192)  # another student's answer is a passage for every classmate graded in the same run
def _passage(where: str, source: str) -> Passage | None:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    normal = normalised(tree)
    functions = tuple((node.name, _segment(source, original), frozenset(shingles(node)))
                      for node, original in _functions(normal, tree) if len(shape(node)) >= MIN_NODES)
    return Passage(where, source, functions, fingerprint(ast.unparse(normal)))


def _functions(normal: ast.AST, original: ast.AST):
    """Each normalised function with the original one of the same name (for the passage as written)."""
    by_name = {}
    for node in ast.walk(original):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            by_name.setdefault(node.name, node)
    for node in ast.walk(normal):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, by_name.get(node.name, node)


def _segment(source: str, node: ast.AST) -> str:
    return ast.get_source_segment(source, node) or ast.unparse(node)


def fingerprint(text: str, boilerplate=None):
    """copydetect's fingerprint of Python text (names filtered; `boilerplate`'s hashes left out), None when it is
    shorter than one k-gram."""
    from copydetect import CodeFingerprint

    try:
        return CodeFingerprint("answer.py", COPYDETECT_K, COPYDETECT_WINDOW, boilerplate=boilerplate,
                               fp=io.StringIO(text))
    except Exception:  # too short for a k-gram, or a text pygments cannot tokenise
        return None


@cache
def _reference_passages() -> tuple[Passage, ...]:
    """minialloc's modules, and the code of the public solution notebooks, one passage per module or cell."""
    out = []
    root = Path(importlib.util.find_spec("minialloc").submodule_search_locations[0])
    for path in sorted(root.rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
        out.append(_passage(f"minialloc's {module}", text))
    for folder in PUBLIC_SOLUTIONS:
        for path in sorted(folder.rglob("*.ipynb")):
            if path.stem.endswith(("_vi", "_de")) or "checkpoint" in str(path):
                continue  # a translation holds the same code
            for number, cell in enumerate(_code_cells(path.read_bytes())):
                name = path.relative_to(ROOT).as_posix()
                out.append(_passage(f"the public solution {name}, cell {number + 1}", cell))
    return tuple(p for p in out if p is not None)


def _code_cells(data: bytes) -> list[str]:
    try:
        cells = json.loads(data)["cells"]
    except (ValueError, KeyError, TypeError):
        return []
    return ["".join(c["source"]) if isinstance(c.get("source"), list) else str(c.get("source", ""))
            for c in cells if isinstance(c, dict) and c.get("cell_type") == "code"]


def _batch_passages(others: Mapping[str, Mapping[str, str]]) -> list[Passage]:
    out = []
    for student, cells in others.items():
        for grade_id, source in cells.items():
            passage = _passage(f"student {ascii(student)}'s {grade_id}", source)
            if passage is not None:
                out.append(passage)
    return out


def _copies(grade_id: str, source: str, tree: ast.AST, known: Iterable[Passage],
            skeleton: ast.AST | None = None) -> list[Copy]:
    normal = normalised(tree)
    shared: set = set()  # the skeleton's shingles: every student has them
    boiler = None
    if skeleton is not None:
        skeleton_normal = normalised(skeleton)
        for node in ast.walk(skeleton_normal):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                shared |= shingles(node)
        boiler = fingerprint(ast.unparse(skeleton_normal))
    mine = [(node.name, _segment(source, original), shingles(node) - shared)
            for node, original in _functions(normal, tree) if len(shape(node)) >= MIN_NODES]
    printed = fingerprint(ast.unparse(normal), boiler.hashes if boiler is not None else None)
    found: dict[str, Copy] = {}
    for passage in known:
        for _name, text, own in mine:  # 1. the syntax tree, function by function
            if not own:
                continue
            for their_name, their_text, theirs in passage.functions:
                share = len(own & theirs) / len(own)
                if share >= SIMILAR:
                    copy = Copy(f"{grade_id}", f"{passage.where} ({their_name})", "syntax tree", share, text,
                                their_text)
                    if copy.where not in found or found[copy.where].alike < share:
                        found[copy.where] = copy
        if printed is not None and passage.fingerprint is not None:  # 2. copydetect, cell against passage
            from copydetect import compare_files

            overlap, (share, _), _ = compare_files(printed, passage.fingerprint)
            if share >= COPYDETECT_SIMILAR and overlap >= COPYDETECT_MIN_TOKENS:
                where = f"{passage.where} (copydetect)"
                found.setdefault(where, Copy(grade_id, passage.where, "copydetect", float(share), source,
                                             passage.source))
    return sorted(found.values(), key=lambda c: -c.alike)[:MAX_COPIES]


# --- normalising: the rewrites that keep a program's meaning ---------------------------------------------------

def _identity_names(tree: ast.AST) -> set[str]:
    """Functions defined in `tree` that return their first argument unchanged: `def f(x, ...): return x`,
    `f = lambda x, ...: x`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = _without_docstring(node.body)
            if (node.args.args and len(body) == 1 and isinstance(body[0], ast.Return)
                    and isinstance(body[0].value, ast.Name) and body[0].value.id == node.args.args[0].arg):
                names.add(node.name)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and _is_identity_lambda(node.value):
            names.add(node.targets[0].id)
    return names


def _is_identity_lambda(node: ast.AST) -> bool:
    return (isinstance(node, ast.Lambda) and bool(node.args.args) and isinstance(node.body, ast.Name)
            and node.body.id == node.args.args[0].arg)


def _without_docstring(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


class _Normaliser(ast.NodeTransformer):
    def __init__(self, identities: set[str]):
        self.identities = identities

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        wraps = (isinstance(node.func, ast.Name) and node.func.id in self.identities) or \
            _is_identity_lambda(node.func)
        if wraps and len(node.args) >= 1 and not isinstance(node.args[0], ast.Starred):
            return node.args[0]
        return node

    def _body(self, body: list) -> list:
        body = [n for n in _without_docstring(body) if not isinstance(n, ast.Pass)]
        kept = []
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name in self.identities:
                continue
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                    and stmt.targets[0].id in self.identities and _is_identity_lambda(stmt.value):
                continue
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a string or number alone: no effect
            kept.append(stmt)
        return _ordered(kept) or [ast.Pass()]

    def generic_visit(self, node):
        super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            value = getattr(node, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, name, self._body(value))
        return node


def _ordered(body: list) -> list:
    """Statements whose order does not matter put in one order: the definitions of a module or class body and its
    imports (sorted by shape), and each run of consecutive assignments whose names do not meet."""
    definitions = [s for s in body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    imports = [s for s in body if isinstance(s, (ast.Import, ast.ImportFrom))]
    rest = [s for s in body if s not in definitions and s not in imports]
    out: list = sorted(imports, key=ast.dump)
    run: list = []
    for stmt in rest + [None]:
        if isinstance(stmt, ast.Assign) and _independent(run + [stmt]):
            run.append(stmt)
            continue
        out += sorted(run, key=lambda s: "".join(shape(s)))
        run = [stmt] if isinstance(stmt, ast.Assign) else []
        if stmt is not None and not isinstance(stmt, ast.Assign):
            out.append(stmt)
    return out + sorted(definitions, key=lambda s: "".join(shape(s)))


def _independent(statements: list) -> bool:
    """No statement of the run reads or writes a name another one writes."""
    written: list[set[str]] = []
    read: list[set[str]] = []
    for stmt in statements:
        names = [n for n in ast.walk(stmt) if isinstance(n, ast.Name)]
        written.append({n.id for n in names if isinstance(n.ctx, ast.Store)})
        read.append({n.id for n in names if isinstance(n.ctx, ast.Load)} |
                    {ast.unparse(t) for t in stmt.targets if not isinstance(t, ast.Name)})
    for i, w in enumerate(written):
        for j in range(len(statements)):
            if i != j and (w & written[j] or w & read[j]):
                return False
    return True


def normalised(tree: ast.AST) -> ast.AST:
    """A copy of `tree` with the meaning-keeping rewrites undone (see the module); names stay (the shape
    comparison blanks them, copydetect filters them)."""
    import copy

    tree = copy.deepcopy(tree)
    tree = _Normaliser(_identity_names(tree)).visit(tree)
    return ast.fix_missing_locations(tree)


# --- the other submissions of the batch ----------------------------------------------------------------------

def read_answers(path: Path, grade_ids: Iterable[str]) -> dict[str, str]:
    """The answer cells (by grade id, among `grade_ids`) of another student's submitted notebook, read without
    following a link and only when it is a regular file of at most MAX_NOTEBOOK_BYTES; empty when it is not."""
    wanted = set(grade_ids)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_size > MAX_NOTEBOOK_BYTES:
            return {}
        data = f.read(MAX_NOTEBOOK_BYTES + 1)
    try:
        cells = json.loads(data)["cells"]
    except (ValueError, KeyError, TypeError):
        return {}
    out = {}
    for cell in cells if isinstance(cells, list) else []:
        meta = cell.get("metadata", {}).get("nbgrader", {}) if isinstance(cell, dict) else {}
        grade_id = meta.get("grade_id") if isinstance(meta, dict) else None
        if cell.get("cell_type") == "code" and grade_id in wanted and grade_id not in out:
            source = cell.get("source", "")
            out[grade_id] = "".join(source) if isinstance(source, list) else str(source)
    return out
