"""``python -m kvtuner`` is the ``kvtuner`` command."""

import sys

from .cli import main

sys.exit(main())
