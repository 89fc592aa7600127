"""`python -m quizzes ...`: see quizzes.cli."""

import sys

from .cli import main

sys.exit(main())
