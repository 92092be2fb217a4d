"""kvtuner.core.hardware."""
