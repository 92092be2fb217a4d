"""Export a configuration to the tools people run it with, and keep kvtuner profiles.

One module per target, all pure Python (no Qt, no llama_cpp):

========================  ====================================================  =====================
target                    what                                                  module
========================  ====================================================  =====================
``llama-server``          command line (also ``llama-cli``)                     :mod:`.llama_server`
``llama-cpp-python``      runnable Python snippet                               :mod:`.llama_cpp_python`
``llama-cpp-python-json`` ``Llama(**kwargs)`` as JSON                           :mod:`.llama_cpp_python`
``ollama``                Modelfile + server environment                        :mod:`.ollama`
``koboldcpp``             ``.kcpps`` settings file                              :mod:`.koboldcpp`
``profile``               kvtuner profile (JSON), opened again by kvtuner       :mod:`.profile`
========================  ====================================================  =====================

Every :class:`ExportResult` lists what its target cannot express in ``limitations``.
Use :func:`export` for any target and :func:`write_text_atomic` to save (never overwrites
without ``force``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..hardware.identity import GpuFingerprint, MachineFingerprint, llama_cpp_build
from ..model.identity import ModelIdentity
from ..plan.config import PlanConfig
from ._common import (
    MEASURED_KEYS,
    ExportError,
    ExportResult,
    clean_measured,
    kv_placement,
    write_export,
    write_text_atomic,
)
from .profile import LoadedProfile, Profile, ProfileError, load_profile, read_profile

#: Every target name :func:`export` accepts, in the order a menu should show them.
TARGETS = ("llama-server", "llama-cli", "llama-cpp-python", "llama-cpp-python-json", "ollama", "koboldcpp", "profile")

__all__ = [
    "MEASURED_KEYS",
    "TARGETS",
    "ExportError",
    "ExportResult",
    "GpuFingerprint",
    "LoadedProfile",
    "MachineFingerprint",
    "ModelIdentity",
    "Profile",
    "ProfileError",
    "clean_measured",
    "export",
    "kv_placement",
    "llama_cpp_build",
    "load_profile",
    "read_profile",
    "write_export",
    "write_text_atomic",
]


def export(
    target: str,
    model_path: str | os.PathLike[str],
    config: PlanConfig,
    *,
    model: Any = None,
    measured: Mapping[str, object] | None = None,
    machine: MachineFingerprint | None = None,
    llama_cpp_build_text: str | None = None,
    gpu_buffer_type: str = "CUDA0",
    binary: str | None = None,
    note: str | None = None,
    split: Any = None,
    rpc: Sequence[str] = (),
) -> ExportResult:
    """Export ``config`` for ``model_path`` to ``target``.

    Args:
        target: one of :data:`TARGETS`.
        model_path: the GGUF file (first part of a split model).
        config: the configuration.
        model: the model's :class:`~kvtuner.core.model.profile.ModelProfile` or
            :class:`ModelIdentity` if already read; otherwise the file header is read only
            when needed (the profile target, or a partial KV split that needs the layer count).
        measured: measured results for the profile target (``decode_tok_s``, ``prefill_tok_s``,
            ``load_s``, ``peak_vram_bytes``, ``peak_rss_bytes``, ``kv_bytes``).
        machine: machine fingerprint for the profile (default: this machine).
        llama_cpp_build_text: llama.cpp build for the profile (default: installed packages).
        gpu_buffer_type: llama.cpp buffer type for ``-ot`` in a partial KV split (``CUDA0``).
        binary: the llama-server / llama-cli executable to write (default: the target name).
        note: free text stored in a profile.
        split: ``-sm`` / ``-ts`` / ``-mg`` (:class:`~kvtuner.core.plan.placement.DeviceSplit`) for
            the llama-server / llama-cli line; None: llama.cpp's default.
        rpc: ``host:port`` of each rpc-server, in order (``--rpc``; llama-server / llama-cli).

    Raises:
        ExportError: an unknown target, a model that cannot be read when needed, or a
            configuration the target cannot write at all (one line saying what to change).
    """
    from . import koboldcpp, llama_cpp_python, llama_server, ollama, profile

    path = Path(model_path).expanduser()
    cache: dict[str, ModelIdentity] = {}

    def identity() -> ModelIdentity:
        if "id" not in cache:
            if model is not None:
                cache["id"] = model if isinstance(model, ModelIdentity) else ModelIdentity.from_profile(model)
            else:
                from ..model.gguf_header import GGUFError

                try:
                    cache["id"] = ModelIdentity.from_path(path)
                except (GGUFError, OSError) as exc:
                    raise ExportError(str(exc)) from None
        return cache["id"]

    def n_layer() -> int:
        return identity().n_layer

    if target in ("llama-server", "llama-cli"):
        return llama_server.render(
            path, config, n_layer, binary=binary or target, gpu_buffer_type=gpu_buffer_type, split=split, rpc=rpc
        )
    if target == "llama-cpp-python":
        return llama_cpp_python.render_snippet(path, config, n_layer)
    if target == "llama-cpp-python-json":
        return llama_cpp_python.render_json(path, config, n_layer)
    if target == "ollama":
        return ollama.render(path, config, n_layer)
    if target == "koboldcpp":
        return koboldcpp.render(path, config, n_layer, gpu_buffer_type=gpu_buffer_type)
    if target == "profile":
        return profile.render(
            path,
            config,
            identity(),
            machine=machine or MachineFingerprint.current(),
            llama_cpp_build=llama_cpp_build_text or llama_cpp_build(),
            measured=measured,
            note=note,
        )
    raise ExportError(f"unknown export format '{target}': use one of {', '.join(TARGETS)}")
