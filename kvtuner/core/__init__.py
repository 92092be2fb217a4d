"""Headless core of kvtuner: no Qt, no llama_cpp (checked by tests/test_layers.py)."""
