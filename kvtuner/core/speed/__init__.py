"""kvtuner.core.speed."""
