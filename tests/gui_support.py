"""Shared pieces of the GUI tests and benchmarks."""

from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore

from kvtuner.core.hardware.specs import HostSpec

GiB = 1 << 30
#: A fixed host for plan-only windows (the real one differs from machine to machine).
HOST = HostSpec(total_bytes=16 * GiB, available_bytes=12 * GiB, swap_total_bytes=2 * GiB)


class IdleSampler:
    """A sampler that samples nothing, for windows whose tests or benchmarks are about the plan,
    not the live graphs (those run the real :class:`kvtuner.core.monitor.sampler.Sampler`)."""

    def start(self):
        return self

    def stop(self, timeout_s=2.0):
        pass

    def set_pid(self, pid):
        pass

    def reset_peaks(self):
        pass

    def host_samples(self, since_t_s=None):
        return []

    def gpu_samples(self, index, since_t_s=None):
        return []

    def gpu_indices(self):
        return []


def ini_settings(folder: Path) -> QtCore.QSettings:
    """QSettings in an INI file under ``folder`` (never the user's real settings)."""
    return QtCore.QSettings(str(folder / "kvtuner.ini"), QtCore.QSettings.Format.IniFormat)
