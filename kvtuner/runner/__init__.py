"""Runner: llama.cpp in a child process (``python -m kvtuner.runner``).

Only :mod:`kvtuner.runner.worker` (the child) imports ``llama_cpp``; the parent-side modules
(:mod:`.client`, :mod:`.dryrun`, :mod:`.bench`, :mod:`.protocol`, :mod:`.llama_log`,
:mod:`.placement`) never do, so the app never loads llama.cpp into its own process and a
GGML_ASSERT or an out-of-memory kill in llama.cpp cannot take it down.
"""
