"""kvtuner's desktop app (PySide6 + pyqtgraph): a thin view over :mod:`kvtuner.core`.

Nothing here computes memory or speed: every figure comes from the core (planner, speed
model, advisor) or from the runner and samplers. Start it with :func:`kvtuner.gui.app.run`
or ``kvtuner gui``.
"""
