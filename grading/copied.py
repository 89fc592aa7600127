"""Answer cells that look delegated to, or copied from, minialloc: reasons for a person to review, not scores.

Read in the grader's process from the answer cells' text (the student cannot change what this sees):
- names of minialloc's implementation (CachingAllocator, ExpandableSegment, BlockManager, the OOM report...) and
  imports of minialloc beyond what the labs hand out;
- code that makes code at run time (exec, eval, compile, __import__, importlib, marshal, pickle, codecs, zlib,
  base64) or reads the interpreter's view of other code (inspect, linecache, gc, ctypes): the ways to run a
  reference's source under another name, or to read a test's;
- a function whose shape (its syntax tree with every name and constant blanked) mostly matches a function of
  minialloc's own sources: pasted code with the names changed.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
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
SIMILAR = 0.75  # share of a function's shingles found in one of minialloc's functions


def copied_work(answers: dict[str, str]) -> list[str]:
    """Reasons to review, "<answer cell>: <why>", for the answer cells' sources by grade id."""
    reasons = []
    for grade_id, source in answers.items():
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue  # it scores nothing anyway
        found = _names(tree) + _similar(tree)
        reasons += [f"{grade_id}: {why}" for why in dict.fromkeys(found)]
    return reasons


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


@cache
def _reference_functions() -> tuple[tuple[str, frozenset], ...]:
    """Every function of minialloc's own sources with its shingles: ("module.function", shingles)."""
    root = Path(importlib.util.find_spec("minialloc").submodule_search_locations[0])
    out = []
    for path in sorted(root.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(shape(node)) >= MIN_NODES:
                name = f"{path.relative_to(root).with_suffix('').as_posix().replace('/', '.')}.{node.name}"
                out.append((name, frozenset(shingles(node))))
    return tuple(out)


def similarity(function: ast.AST) -> tuple[float, str]:
    """The largest share of `function`'s shingles found in one function of minialloc, and which."""
    mine = shingles(function)
    if not mine:
        return 0.0, ""
    best, where = 0.0, ""
    for name, theirs in _reference_functions():
        share = len(mine & theirs) / len(mine)
        if share > best:
            best, where = share, name
    return best, where


def _similar(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(shape(node)) >= MIN_NODES:
            share, where = similarity(node)
            if share >= SIMILAR:
                found.append(f"{node.name} has the shape of minialloc's {where} ({share:.0%} alike)")
    return found
