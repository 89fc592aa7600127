"""nbgrader configuration for minialloc's graded notebooks. Run nbgrader from the repository root.

One nbgrader course holds every graded assignment: its root is labs/, so the source notebooks live in
labs/source/<assignment>/, and nbgrader writes labs/release/, labs/submitted/, labs/autograded/,
labs/feedback/ and labs/gradebook.db (all ignored by git). Paths are computed from this file's location, so the
commands work from any clone. See labs/README.md for the instructor's commands and docs/grading.md for what the
grader defends against, by what, and what stays the instructor's call.

The grader's classes live in an importable module, grading/ (this repository installed with
`pip install -e .`): preprocessors.py (execution guarded per cell, test cells restored from the gradebook, tags
stripped, cells that did not run failed, feedback scanned for private keys) and sandbox.py (every student kernel
runs under bubblewrap: apt-get install bubblewrap). This file only puts them in nbgrader's pipeline. The graded
quizzes (quizzes/graded/nbgrader_config.py) load this file with load_subconfig before their own settings.
"""

import os

from nbgrader.converters.autograde import Autograde
from nbgrader.preprocessors import ClearHiddenTests, Execute, GetGrades, OverwriteCells, SaveAutoGrades

from grading import privacy, sanitize
from grading.export import SafeCsvExportPlugin
from grading.intake import CheckedCollect, install
from grading.labgrade import LabGrade
from grading.preprocessors import (
    ErrorsFailTests,
    FlagForReview,
    GuardedExecute,
    HideTestTracebacks,
    InertOutputs,
    KernelOutputsWithheld,
    RedactHiddenTests,
    RestoringOverwriteCells,
    ScanForKeys,
    StripExecutionControl,
    insert_around,
    swap,
)

c = get_config()  # noqa: F821 -- traitlets defines get_config() when it loads this file

REPO = os.path.dirname(os.path.abspath(__file__))


# === Course directory (shared by all assignments) ================================================================
c.CourseDirectory.root = os.path.join(REPO, "labs")
c.CourseDirectory.source_directory = "source"  # labs/source/<assignment>/<assignment>.ipynb
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.submitted_directory = "submitted"  # labs/submitted/<student>/<assignment>/
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
# the gradebook is sqlite:///<root>/gradebook.db unless CourseDirectory.db_url says otherwise (docs/jupyterhub.md)
# The course's id in the exchange and on a hub (its service, its nbgrader-<id> group, the folder students fetch
# into): not the package's name, and no Python name at all, so a folder made by a fetch (~/minialloc-course/)
# cannot be imported in place of a package. The graded quiz (quizzes/graded/) is released under the same id.
c.CourseDirectory.course_id = "minialloc-course"
# No Exchange.root here: the exchange is the site's, set once (/etc/jupyter/nbgrader_config.py on a hub:
# deploy/hub/), else nbgrader's default /usr/local/share/nbgrader/exchange (`sudo make exchange`); a repository
# file loaded last would override the site's. It lives outside the course directory, so that students never need
# to enter this folder (grading/privacy.py: the grading commands refuse while other accounts can read it).

# === generate_assignment: what the students' copy loses (nbgrader's defaults, spelled out) =======================
c.ClearSolutions.begin_solution_delimeter = "BEGIN SOLUTION"  # ### BEGIN SOLUTION ... ### END SOLUTION
c.ClearSolutions.end_solution_delimeter = "END SOLUTION"
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearHiddenTests.begin_test_delimeter = "BEGIN HIDDEN TESTS"  # removed from the release, run at autograde
c.ClearHiddenTests.end_test_delimeter = "END HIDDEN TESTS"

# === What the grader reads ========================================================================================
# a submission folder holding a symbolic link, a hard-linked file or a special file is refused for that student,
# before nbgrader reads or copies anything in it (autograde), and is not copied out of the exchange (collect):
# grading/intake.py. nbgrader has no setting for its Autograde or GenerateFeedback class: install() points
# nbgrader's apps at the checking subclasses. Student ids and assignment names outside
# [A-Za-z0-9][A-Za-z0-9_.-]{0,63} (no '..') are refused by name at collect and autograde; the rest is graded.
install()
# the grading commands check that no other account can read the course directory, the gradebook, the private
# bank or the keys, and run with the umask 077 (grading/privacy.py)
privacy.install()
c.ExchangeFactory.collect = CheckedCollect
# collect refuses (nbgrader only warns) a submission whose exchange folder does not belong to the user named by
# its student id (login name == student id on one machine); off only where the exchange is not per-user
c.ExchangeCollect.check_owner = True
# a submitted notebook larger than this is refused before nbgrader reads it (a pasted image is ~0.1 MB)
c.Autograde.max_notebook_bytes = 10_000_000
# and one whose markdown cells hold more than 200 000 characters (rendering them takes time in proportion)
c.Autograde.max_markdown_chars = 200_000
# and one with a code cell of more than 50 000 characters (the largest answer of the labs' solutions is 3 500);
# the refusal names the cell
c.Autograde.max_code_cell_chars = 50_000

# === autograde ===================================================================================================
# time: each cell gets 30 s, then the kernel is interrupted and that cell fails; a kernel still busy 5 s after
# the interrupt is killed and the remaining cells fail; a notebook gets 10 minutes in all
c.Execute.timeout = 30
c.Execute.interrupt_on_timeout = True
c.ExecutePreprocessor.timeout = 30
c.GuardedExecute.interrupt_grace = 5
c.GuardedExecute.notebook_timeout = 600
# output: 100 000 characters per cell and 2 000 000 per notebook as it arrives (every message counts: streams,
# displays, display updates times the outputs they rewrite, errors, widget state), at most 10 000 messages per
# cell, then nbgrader's own limits of 1000 lines per cell and 100 traceback lines per error
c.GuardedExecute.max_output_chars = 100_000
c.GuardedExecute.max_notebook_output_chars = 2_000_000
c.GuardedExecute.max_messages_per_cell = 10_000
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100
# the order of nbgrader 0.9's default lists, with the preprocessors above swapped in or added
c.Autograde.sanitize_preprocessors = swap(
    Autograde.class_traits()["sanitize_preprocessors"].default(), OverwriteCells, RestoringOverwriteCells)
c.Autograde.autograde_preprocessors = insert_around(
    insert_around(swap(Autograde.class_traits()["autograde_preprocessors"].default(), Execute, GuardedExecute),
                  GuardedExecute, before=[StripExecutionControl], after=[InertOutputs]),
    SaveAutoGrades, before=[LabGrade, ErrorsFailTests], after=[FlagForReview])
# the sandbox (grading/sandbox.py): the kernel sees the system, Python, the virtual environment and the
# packages below read-only, and a copy of the submission's folder; 3 GiB of address space, 128 processes and
# threads (when autograde runs as root), files up to 256 MiB, messages to the grader up to 16 MiB
c.GuardedExecute.sandbox = True
c.SandboxKernelManager.packages = ["minialloc"]
c.SandboxKernelManager.memory_bytes = 3 * 1024**3
c.SandboxKernelManager.max_processes = 128
c.SandboxKernelManager.max_message_bytes = 16 * 1024**2
c.Autograde.create_student = True  # a student missing from the gradebook is added

# === generate_feedback ===========================================================================================
# each notebook's feedback within 2 minutes, or that student's feedback fails, named in the log, and the others
# go on (grading/feedback.py, installed by install() above)
c.GenerateFeedback.notebook_timeout = 120
# hidden tests cleared from the feedback's source and from every output that quotes them, test cells shown as
# pass/fail and their error's message only (a traceback quotes the hidden assert; what a test cell printed was
# printed by the student's code), no active
# content in any output (again: a notebook autograded before InertOutputs was added), and no private-key
# material: the issuer key's default place is checked, add yours
# no output of the kernel's at all (it ran the hidden tests: any output can carry them, in any encoding), only the
# grader's verdicts
c.GenerateFeedback.preprocessors = [GetGrades, RedactHiddenTests, ClearHiddenTests, HideTestTracebacks,
                                    KernelOutputsWithheld, InertOutputs, ScanForKeys,
                                    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor"]
# what is left is cleaned where it is rendered, by an allow-list sanitizer (nh3: grading/sanitize.py):
# nbgrader's feedback template renders markdown cells with the `markdown2html` filter and no cleaning, and HTML
# outputs with `clean_html` when sanitize_html is on; both filters are replaced by sanitizing ones. The formgrader
# gets the same filters from grading/browser_guard.py (`make grade` loads it).
c.HTMLExporter.sanitize_html = True
c.HTMLExporter.filters = {"markdown2html": sanitize.markdown2html, "clean_html": sanitize.clean_html}
c.ScanForKeys.key_files = ["~/.minialloc-issuer/issuer-ed25519.pem"]

# === Labs (labs/source/lab*) =====================================================================================
# Each lab imports minialloc, which must be installed in the grading kernel's environment (pip install -e . in the
# repository). The labs listed in grading/labspecs are scored by LabGrade (above, before ErrorsFailTests):
# their answer cells run again in a fresh sandboxed process on inputs chosen at grading time, and the grader's
# process compares what they return with minialloc; the kernel's test cells are the student's feedback only.
# Each cell and probe there gets Execute.timeout and GuardedExecute.interrupt_grace; the whole program:
c.LabGrade.total_timeout = 600

# === Graded quizzes ==============================================================================================
# quizzes/graded/ is a course of its own with its own nbgrader_config.py (run nbgrader from there).

# === export ======================================================================================================
# `nbgrader export` writes grades.csv with every field quoted and no field a spreadsheet formula (nbgrader's own
# plugin joins fields unquoted): grading/export.py
c.ExportApp.plugin_class = SafeCsvExportPlugin
