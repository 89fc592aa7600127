"""``python -m course_i18n extract|build|check``: one command line over the chapters (tool), the labs (labs) and the
code's learner-facing strings (code)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import bank, code
from .labs import LabLayout
from .tool import LANGS, Layout, build, check, extract


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_i18n",
                                     description="The course, its labs and the code's learner-facing strings in "
                                                 "Vietnamese and German, from gettext catalogs. Each command covers "
                                                 "the chapters, the labs and the code (--only to choose one).")
    parser.add_argument("--course", type=Path, default=Path("course"), help="the English notebooks (course/)")
    parser.add_argument("--locale-dir", type=Path, default=None,
                        help="the chapters' catalogs (default COURSE/locale; drafts: course/locale-work)")
    parser.add_argument("--labs", type=Path, default=Path("labs"),
                        help="the nbgrader course directory: English labs in LABS/source/<lab>/ (labs/); its "
                             "glossaries and chapters are those of the course folder next to it")
    parser.add_argument("--labs-locale-dir", type=Path, default=None,
                        help="the labs' catalogs (default LABS/locale; drafts: labs/locale-work)")
    parser.add_argument("--only", choices=("course", "labs", "code"),
                        help="only the chapters, only the labs, or only the code's strings (minialloc.lang.messages "
                             "tables of minialloc/ and quizzes/, catalogs <package>/locale/<lang>/LC_MESSAGES/; "
                             "check also keeps the quiz bank quizzes/bank/*.json to the glossaries)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_extract = sub.add_parser("extract", help="update the catalogs from the English notebooks (changed -> fuzzy)")
    p_extract.add_argument("notebooks", nargs="*",
                           help="chapter or lab names to extract, creating their catalogs (default: those with "
                                "catalogs)")
    p_extract.add_argument("--lang", action="append", choices=LANGS, help="only this language (repeatable)")
    p_build = sub.add_parser("build", help="write course/<lang>/*.ipynb and labs/source/<lab>_<lang>/ from the "
                                           "English notebooks and catalogs")
    p_build.add_argument("--lang", action="append", choices=LANGS)
    sub.add_parser("check", help="exit 1, with a list, unless every catalog is complete, follows the glossary and "
                                 "its notebook is up to date")
    args = parser.parse_args(argv)
    # the packages sit beside the course folder, in the repository root
    code_layout = code.CodeLayout(args.course.parent, args.course) if args.only in (None, "code") else None
    layouts: list[Layout] = []
    if args.only in (None, "course"):
        layouts.append(Layout.default(args.course, args.locale_dir))
    if args.only in (None, "labs"):
        layouts.append(LabLayout.for_labs(args.labs, args.labs_locale_dir, args.labs.parent / "course"))
    if args.command == "extract":
        names = [Path(n).stem for n in args.notebooks]
        for layout in layouts:
            if isinstance(layout, LabLayout):
                stems = [n for n in names if layout.source(n).is_file()]
            else:
                stems = [n for n in names if not LabLayout.for_labs(args.labs).source(n).is_file()]
            if names and not stems:
                continue  # every name belongs to the other kind
            for path in extract(layout, stems, args.lang or LANGS):
                print(f"updated {path}")
        if code_layout is not None and not names:
            for path in code.extract(code_layout, args.lang or LANGS):
                print(f"updated {path}")
        return 0
    if args.command == "build":
        for layout in layouts:
            home = layout.labs / "locale" if isinstance(layout, LabLayout) else layout.course / "locale"
            if layout.locale.resolve() != home.resolve():
                # the translated notebooks are built from the real catalogs only: a notebook built from a draft
                # would have no catalog there, and the check would (rightly) flag it
                print(f"build reads {home} only; move a translated catalog there first", file=sys.stderr)
                return 2
        for layout in layouts:
            for line in build(layout, args.lang or LANGS):
                print(line)
        if code_layout is not None:
            for line in code.build(code_layout, args.lang or LANGS):
                print(line)
        return 0
    problems: list[str] = []
    for layout in layouts:
        report = check(layout)
        for note in report.notes:
            print(note)
        problems += [p for p in report.problems if p not in problems]  # a broken glossary is met twice
    if code_layout is not None:
        try:
            problems += code.check(code_layout, LANGS)
            problems += bank.check(code_layout.root / "quizzes" / "bank", code_layout.glossary, LANGS)
        except (ValueError, KeyError) as exc:  # a broken glossary: already reported by the layouts above
            problems.append(str(exc))
    for problem in problems:
        print(problem, file=sys.stdout)
    if problems:
        print(f"i18n check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    return 0
