"""kvtuner.core.monitor."""
