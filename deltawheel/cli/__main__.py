"""``python -m deltawheel.cli``: the ``deltawheel`` command line."""

import sys

from . import main

sys.exit(main())
