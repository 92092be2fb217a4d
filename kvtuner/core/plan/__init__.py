"""kvtuner.core.plan."""
