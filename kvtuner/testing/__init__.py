"""Test and benchmark support shared by ``tests/`` and ``benchmarks/`` (like ``numpy.testing``).

Synthetic GGUF models (:mod:`.gguf_factory`, :mod:`.gguf_families`, :mod:`.gguf_extras`), the
pynvml stand-in (:mod:`.nvml_standin`), servers of the tests' own (:mod:`.http_support`,
:mod:`.server_support`), a child's signal state (:mod:`.processes`), the window's test pieces
(:mod:`.gui_support`) and loading a benchmark script by its path (:mod:`.scripts`). The app never
imports this package (an import-linter contract in pyproject.toml) and the desktop bundle leaves it
out (packaging/kvtuner.spec).
"""
