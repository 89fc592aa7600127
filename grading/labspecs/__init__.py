"""The labs scored in the grader's process: for each, the probes that run in the grading sandbox
(<lab>_probes.py, after probe_common.py) and the module that chooses their inputs and checks their data
(<lab>.py: `GRADED`, `inputs(grade_id, rng)`, `check(grade_id, args, result)`, and `GRADER_ONLY`, the keys of
the inputs that only the check reads). A probe gets `probe_args(...)`: the inputs and nothing the grader derived
from its references.

A translated lab (<lab>_vi, <lab>_de) has the English lab's graded cells byte for byte (course_i18n refuses to build
it otherwise), so it is scored by the English lab's module.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
# the labs whose scores come from the grader's process
SCORED = ("lab1_best_fit", "lab2_fragmentation_oom", "lab3_page_mapping", "lab4_block_table_cow", "lab5_oom_decisions")
LANGUAGES = ("_vi", "_de")


def base_lab(assignment: str) -> str:
    for suffix in LANGUAGES:
        if assignment.endswith(suffix):
            return assignment.removesuffix(suffix)
    return assignment


def spec_for(assignment: str) -> ModuleType | None:
    """The checking module of an assignment, None when the lab is not scored here."""
    lab = base_lab(assignment)
    return importlib.import_module(f"{__name__}.{lab}") if lab in SCORED else None


def probes_source(assignment: str) -> str:
    """The text the sandbox runs: the shared helpers, then the lab's probes."""
    lab = base_lab(assignment)
    return (HERE / "probe_common.py").read_text(encoding="utf-8") + "\n\n" + \
        (HERE / f"{lab}_probes.py").read_text(encoding="utf-8")


def probe_args(spec: ModuleType, args: dict) -> dict:
    """What the sandbox gets of a test's inputs: every key but the spec's GRADER_ONLY ones."""
    return {key: value for key, value in args.items() if key not in getattr(spec, "GRADER_ONLY", ())}
