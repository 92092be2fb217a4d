"""``python -m kvtuner.runner``: the runner child process (see :mod:`kvtuner.runner.worker`)."""

import signal
import sys

if __name__ == "__main__":
    # The parent owns the lifetime: Ctrl-C in a terminal reaches the whole process group,
    # the child leaves it to the parent (which cancels or closes it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from kvtuner.runner.worker import main

    sys.exit(main())
