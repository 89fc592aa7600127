"""nbgrader configuration for minialloc's graded notebooks. Run nbgrader from the repository root.

One nbgrader course holds every graded assignment: its root is labs/, so the source notebooks live in
labs/source/<assignment>/, and nbgrader writes labs/release/, labs/submitted/, labs/autograded/,
labs/feedback/ and labs/gradebook.db (all ignored by git). Paths are computed from this file's location, so the
commands work from any clone. See labs/README.md for the instructor's commands.
"""

import os

c = get_config()  # noqa: F821 -- traitlets defines get_config() when it loads this file

REPO = os.path.dirname(os.path.abspath(__file__))

# --- Course directory (shared by all assignments) ----------------------------------------------------------------
c.CourseDirectory.root = os.path.join(REPO, "labs")
c.CourseDirectory.source_directory = "source"  # labs/source/<assignment>/<assignment>.ipynb
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.submitted_directory = "submitted"  # labs/submitted/<student>/<assignment>/
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
# the gradebook is sqlite:///<root>/gradebook.db unless CourseDirectory.db_url says otherwise

# --- generate_assignment: what the students' copy loses (nbgrader's defaults, spelled out) -----------------------
c.ClearSolutions.begin_solution_delimeter = "BEGIN SOLUTION"  # ### BEGIN SOLUTION ... ### END SOLUTION
c.ClearSolutions.end_solution_delimeter = "END SOLUTION"
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearHiddenTests.begin_test_delimeter = "BEGIN HIDDEN TESTS"  # removed from the release, run at autograde
c.ClearHiddenTests.end_test_delimeter = "END HIDDEN TESTS"

# --- autograde: each cell gets 30 s, then the kernel is interrupted and that cell fails --------------------------
c.Execute.timeout = 30
c.Execute.interrupt_on_timeout = True
c.ExecutePreprocessor.timeout = 30
c.Autograde.create_student = True  # a student missing from the gradebook is added

# --- Labs (labs/source/lab*) --------------------------------------------------------------------------------------
# Nothing lab-specific is needed: each lab imports minialloc, which must be installed in the grading kernel's
# environment (pip install -e . in the repository).

# --- Graded quizzes ---------------------------------------------------------------------------------------------
# Reserved for the quiz assignments; they join the same course as labs/source/<quiz>/ or add their settings here.
