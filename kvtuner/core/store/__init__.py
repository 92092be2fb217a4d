"""kvtuner.core.store."""
