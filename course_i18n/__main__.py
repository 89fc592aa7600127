"""``python -m course_i18n extract|build|check``."""

import sys

from .cli import main

sys.exit(main())
