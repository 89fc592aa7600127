"""The grader's side of nbgrader: preprocessors that run in the grader's process, and the kernel sandbox.

- `grading.sandbox`: every student kernel that autograde starts runs under bubblewrap (no network, no view
  of the course's sources, gradebook, keys or home directory, killed with its notebook, limited in processes and
  memory); `sandbox_can_read(path)` says whether a file is within that kernel's reach.
- `grading.preprocessors`: execution guarded per cell, test cells restored from the gradebook, execution
  control tags stripped, cells that did not run scored 0, the graded quiz scored from the executed notebook's
  plain answers, outputs made inert, feedback without test-cell output, hidden tests or private-key material.
- `grading.intake`: a submission folder holding a link or a special file is refused before nbgrader reads
  anything in it (autograde and collect).
- `grading.sanitize`: the allow-list HTML sanitizer (nh3) for what nbgrader renders of a submission;
  `grading.browser_guard`: the Jupyter Server extension `make grade` loads (a Content-Security-Policy on the
  formgrader and on served files, its templates escaped and sanitized); `grading.export`: `nbgrader export`
  as a quoted, formula-free CSV.
- `grading.batch` (`python -m grading autograde`): a class autograded by N workers, or one shard of it, into a
  shared gradebook; `grading.gradebook_copy` (`python -m grading copy-gradebook`): SQLite to PostgreSQL.

The repository's nbgrader_config.py installs all of it; docs/grading.md says what each part defends.
"""
