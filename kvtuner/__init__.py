"""kvtuner: plan, monitor and tune llama.cpp memory for long contexts on small GPUs.

Layers (docs/development/architecture.md):

- :mod:`kvtuner.core`   pure Python: model profile, memory planner, samplers, exporters.
- :mod:`kvtuner.runner` the only code that imports ``llama_cpp``; always in a child process.
- :mod:`kvtuner.gui`    the only code that imports Qt / pyqtgraph.
- :mod:`kvtuner.cli`    ``kvtuner`` command line.
"""

__version__ = "0.1.0"
