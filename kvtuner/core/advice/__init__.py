"""kvtuner.core.advice."""
