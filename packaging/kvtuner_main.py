"""Entry script of the frozen app (PyInstaller analyses this file, packaging/kvtuner.spec).

One executable, two roles: run with ``--kvtuner-runner-child`` as its first argument it is the
runner child process (what ``python -m kvtuner.runner`` is outside the bundle: a frozen app has
no ``-m``, so :func:`kvtuner.runner.client.child_command` starts ``sys.executable`` with that
argument); otherwise it is the ``kvtuner`` command line.
"""

import sys

from kvtuner.runner.client import RUNNER_ARGUMENT

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == RUNNER_ARGUMENT:
        del sys.argv[1]
        from kvtuner.runner.__main__ import child_main

        sys.exit(child_main())
    from kvtuner.cli import main

    sys.exit(main())
