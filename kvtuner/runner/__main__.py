"""``python -m kvtuner.runner``: the runner child process (see :mod:`kvtuner.runner.worker`).

A frozen app (the PyInstaller bundle, packaging/) has no ``-m``: its executable re-enters here
through :func:`child_main` when its first argument is :data:`kvtuner.runner.client.RUNNER_ARGUMENT`
(packaging/kvtuner_main.py).
"""

import signal
import sys


def child_main() -> int:
    """Run the runner child on stdin/stdout until told to shut down; returns its exit status."""
    # The parent owns the lifetime: Ctrl-C in a terminal reaches the whole process group,
    # the child leaves it to the parent (which cancels or closes it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from kvtuner.runner.worker import main

    return main()


if __name__ == "__main__":
    sys.exit(child_main())
