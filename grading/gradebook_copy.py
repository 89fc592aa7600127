"""Move a gradebook from one database to another (SQLite to PostgreSQL), every row, checked after the copy.

nbgrader keeps its gradebook in the tables of `nbgrader.api.Base` (students, assignments, notebooks, cells,
submissions, grades, comments, ...), with string UUID keys, plus alembic's `alembic_version`. The copy makes the
target's tables with nbgrader's own `Gradebook` (as a first `nbgrader` command on that URL would), refuses a
target that already holds a course's rows or another schema version, copies every table in foreign-key order in
one transaction, and then compares the two: the number of rows of every table, and every submission's score,
each grade's scores and each comment. Nothing is written to the source.
"""

from __future__ import annotations

from pathlib import Path

from grading.batch import BatchError, db_shown
from grading.intake import id_problem


def _engine(db_url: str, must_exist: bool):
    from sqlalchemy import create_engine

    if "://" not in db_url:
        raise BatchError(f"{db_url!r} is not a database URL; for a file write sqlite:///path/to/gradebook.db")
    if must_exist and db_url.startswith("sqlite:///"):
        path = Path(db_url.removeprefix("sqlite:///"))
        if not path.is_file():
            raise BatchError(f"no gradebook at {path} (from {db_url})")
    return create_engine(db_url, future=True)


def _version(connection) -> str | None:
    from sqlalchemy import inspect, text

    if "alembic_version" not in inspect(connection).get_table_names():
        return None
    return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def _scores(db_url: str) -> dict:
    """What a copy must keep, read through nbgrader's API: every grade's and comment's content, per submission."""
    from nbgrader.api import Gradebook

    out: dict = {}
    with Gradebook(db_url) as gb:
        for assignment in gb.assignments:
            for submission in assignment.submissions:
                key = (assignment.name, submission.student.id)
                grades = sorted((g.notebook.name, g.name, g.auto_score, g.manual_score, g.extra_credit,
                                 g.needs_manual_grade) for nb in submission.notebooks for g in nb.grades)
                comments = sorted((c.notebook.name, c.name, c.auto_comment, c.manual_comment)
                                  for nb in submission.notebooks for c in nb.comments)
                out[key] = (submission.score, submission.timestamp, submission.late_submission_penalty, grades,
                            comments)
    return out


def copy_gradebook(source_url: str, target_url: str, course_id: str | None = None) -> dict[str, int]:
    """Copy the gradebook at `source_url` into the empty database at `target_url`; the rows copied per table.

    nbgrader without a course id (CourseDirectory.course_id, empty by default) files assignments under course ''
    and adds no such course: SQLite does not check that foreign key, PostgreSQL does. `course_id` then names the
    course those assignments move to (set the same c.CourseDirectory.course_id for the new gradebook)."""
    from nbgrader.api import Base, Gradebook
    from sqlalchemy import func, inspect, select

    source = _engine(source_url, must_exist=True)
    with source.connect() as conn:
        missing = [t.name for t in Base.metadata.sorted_tables if t.name not in inspect(conn).get_table_names()]
        if missing:
            raise BatchError(f"{db_shown(source_url)} is not an nbgrader gradebook (no table {missing[0]!r})")
        source_version = _version(conn)
        courses = {row[0] for row in conn.execute(select(Base.metadata.tables["course"].c.id))}
        orphans = {row[0] for row in conn.execute(select(Base.metadata.tables["assignment"].c.course_id))} - courses
    if orphans and not course_id:
        raise BatchError(f"the source files assignments under the course id(s) {sorted(orphans)}, which its course "
                         "table lacks (nbgrader run without CourseDirectory.course_id): give --course-id NAME, and "
                         "set c.CourseDirectory.course_id = NAME with the new gradebook")
    if course_id is not None and (problem := id_problem("course id", course_id)) is not None:
        raise BatchError(problem)
    target = _engine(target_url, must_exist=False)
    with target.connect() as conn:
        held = [t.name for t in Base.metadata.sorted_tables if t.name in inspect(conn).get_table_names()
                and t.name != "course" and conn.execute(select(func.count()).select_from(t)).scalar()]
    if held:
        raise BatchError(f"the target {db_shown(target_url)} already holds a gradebook (rows in {held[0]!r}): "
                         "copy into a new, empty database")
    Gradebook(target_url).close()  # nbgrader's tables and its alembic stamp, as its own commands make them
    counts: dict[str, int] = {}
    with source.connect() as src, target.begin() as dst:
        target_version = _version(dst)
        if source_version != target_version:
            raise BatchError(f"the source's gradebook schema is {source_version!r}, this nbgrader's is "
                             f"{target_version!r}: run `nbgrader db upgrade` on the source first")
        for table in Base.metadata.sorted_tables:  # parents before children (foreign keys)
            dst.execute(table.delete())  # the empty course row Gradebook() added comes back from the source
            rows = [dict(row) for row in src.execute(select(table)).mappings()]
            if table.name == "course" and orphans:
                rows += [{"id": course_id}] if course_id not in courses else []
            if table.name == "assignment" and orphans:
                rows = [{**r, "course_id": course_id if r["course_id"] in orphans else r["course_id"]} for r in rows]
            if rows:
                dst.execute(table.insert(), rows)
            counts[table.name] = len(rows)
    with source.connect() as src, target.connect() as dst:
        for table in Base.metadata.sorted_tables:
            a = src.execute(select(func.count()).select_from(table)).scalar() + (table.name == "course") * len(
                {course_id} - courses if orphans else ())
            b = dst.execute(select(func.count()).select_from(table)).scalar()
            if a != b:
                raise BatchError(f"after the copy, table {table.name!r} has {b} rows in the target, {a} in the source")
    source.dispose()
    target.dispose()
    if _scores(source_url) != _scores(target_url):
        raise BatchError("after the copy, the grades read back from the target differ from the source's: keep "
                         "using the source and report this")
    return counts
