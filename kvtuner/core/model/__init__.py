"""kvtuner.core.model."""
