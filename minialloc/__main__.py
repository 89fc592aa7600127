"""`python -m minialloc ...` is the `minialloc` command."""

import sys

from .cli import main

sys.exit(main())
