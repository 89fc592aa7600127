"""The grader's commands for a big class (docs/grading.md, "A big class"):

  python -m grading autograde ASSIGNMENT [--workers N] [--shard K/N] [--db URL] [--timeout S] [--force]
                                         [--log-dir DIR] [--config FILE] [--root DIR] [--Class.trait=value ...]
      every submission of ASSIGNMENT not graded yet, N at a time, each one student's nbgrader autograde with the
      course's configuration (the sandbox included), into the gradebook at URL (default: the configuration's).
      Exit status 0 when every student of the shard is graded, 1 when some are not (named in the log), 2 when
      the batch cannot start.
  python -m grading copy-gradebook SOURCE_URL TARGET_URL [--course-id NAME]
      the whole gradebook into a new, empty database (SQLite to PostgreSQL), checked row by row and grade by grade.

The gradebook's URL may come from the environment instead of the command line (a password in it would show in
the process list): NBGRADER_DB_URL is read when --db is not given.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from grading.batch import DEFAULT_TIMEOUT_S, BatchError, db_shown, grade_batch, load_config, parse_shard

URL_VARIABLE = "NBGRADER_DB_URL"  # as docs/jupyterhub.md's grader config reads it


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grading", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("autograde", help="autograde a class in parallel, or one shard of it")
    a.add_argument("assignment")
    a.add_argument("--workers", type=int, default=1, help="students graded at once (default 1)")
    a.add_argument("--shard", default="0/1", help="K/N: this run grades shard K (0 <= K < N) of the class")
    a.add_argument("--db", help=f"the gradebook's SQLAlchemy URL (default: ${URL_VARIABLE}, else the config's)")
    a.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds one student's worker may take before it is killed (default {DEFAULT_TIMEOUT_S:g})")
    a.add_argument("--force", action="store_true", help="grade again the students already graded")
    a.add_argument("--log-dir", help="write each student's whole nbgrader log to DIR/<student>.log")
    a.add_argument("--config", default="nbgrader_config.py", help="the course's nbgrader_config.py (default: ./)")
    a.add_argument("--root", help="the course directory (default: the config's CourseDirectory.root)")
    c = sub.add_parser("copy-gradebook", help="copy a gradebook into a new database, checked")
    c.add_argument("source")
    c.add_argument("target")
    c.add_argument("--course-id", help="the course the source's assignments without one move to (PostgreSQL needs "
                                       "one: set the same c.CourseDirectory.course_id afterwards)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args, extra = _parser().parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s %(levelname)s] %(message)s", stream=sys.stderr)
    try:
        if args.command == "copy-gradebook":
            if extra:
                raise BatchError(f"unknown argument {extra[0]!r}")
            from grading.gradebook_copy import copy_gradebook

            counts = copy_gradebook(args.source, args.target, args.course_id)
            print(f"copied {sum(counts.values())} rows ({counts.get('submitted_assignment', 0)} submissions) from "
                  f"{db_shown(args.source)} to {db_shown(args.target)}; every grade read back the same")
            return 0
        shard = parse_shard(args.shard)  # before the config, which takes seconds to load
        config = load_config(args.config, extra, root=args.root, db_url=args.db or os.environ.get(URL_VARIABLE))
        # out of the environment once the config has read it, before any worker starts: the sandbox clears a
        # kernel's environment, but a grader run with the sandbox off would hand it to student code
        os.environ.pop(URL_VARIABLE, None)
        report = grade_batch(config, args.assignment, workers=args.workers, shard=shard,
                             timeout=args.timeout, force=args.force, log_dir=args.log_dir)
    except BatchError as error:
        print(f"python -m grading: {error}", file=sys.stderr)
        return 2
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
