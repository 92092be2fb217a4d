"""``python -m kvtuner.runner``: the runner child process (see :mod:`kvtuner.runner.worker`).

A frozen app (the PyInstaller bundle, packaging/) has no ``-m``: its executable re-enters here
through :func:`child_main` when its first argument is :data:`kvtuner.runner.client.RUNNER_ARGUMENT`
(packaging/kvtuner_main.py).

With ``--watch-group PGID`` it is instead the watchdog of a llama-server process group
(:func:`kvtuner.runner.watchdog.watch_group`): it stops that group when its stdin closes.
"""

import signal
import sys


def child_main() -> int:
    """Run the runner child on stdin/stdout until told to shut down; returns its exit status."""
    # The parent owns the lifetime: Ctrl-C in a terminal reaches the whole process group,
    # the child leaves it to the parent (which cancels or closes it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if "--watch-group" in sys.argv[1:-1]:
        from kvtuner.runner.watchdog import watch_group

        return watch_group(int(sys.argv[sys.argv.index("--watch-group") + 1]))
    from kvtuner.runner.worker import main

    return main()


if __name__ == "__main__":
    sys.exit(child_main())
