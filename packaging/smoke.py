"""Smoke test of the built bundle (``make package-smoke``): four commands from a folder outside
the checkout, with no Python on PATH and empty user directories, so the bundle must bring
everything (interpreter, llama.cpp libraries, Qt, the default model's chunks):

1. ``kvtuner --version``: names the bundle and the llama.cpp build planned for;
2. ``kvtuner plan --json``: plans the embedded default model (assembled at first run into the
   empty cache directory, ~250 MB write);
3. ``kvtuner bench -n 8 --json``: a real bench in the runner child, which re-enters through the
   frozen executable (``--kvtuner-runner-child``);
4. ``kvtuner gui --screenshot FILE`` offscreen: the window renders to a PNG.

    python packaging/smoke.py [BUNDLE_DIR]    # default dist/kvtuner; exit 0 when all pass

Prints each check's wall time in s and the bundle's size in MiB.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 1024 * 1024


def folder_bytes(path: Path) -> int:
    """Bytes of all regular files under ``path`` (symlinks not followed)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def png_size_px(path: Path) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk (PNG spec 11.2.2)."""
    head = path.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


def main(argv: list[str] | None = None) -> int:
    """Run the four checks; returns 0 if all pass, 1 otherwise."""
    args = sys.argv[1:] if argv is None else argv
    bundle = Path(args[0] if args else "dist/kvtuner").resolve()
    exe = bundle / "kvtuner"
    if not exe.is_file():
        print(f"smoke: no bundle at {bundle} (run 'make package' first, or pass BUNDLE_DIR)", file=sys.stderr)
        return 2
    print(f"bundle {bundle}: {folder_bytes(bundle) / MIB:.0f} MiB")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="kvtuner-smoke-") as tmp_name:
        tmp = Path(tmp_name)
        env = {
            "PATH": "/usr/bin:/bin",  # no virtualenv, no python of the checkout
            "HOME": str(tmp / "home"),
            "XDG_CACHE_HOME": str(tmp / "cache"),  # empty: the default model is assembled again
            "XDG_CONFIG_HOME": str(tmp / "config"),
            "XDG_DATA_HOME": str(tmp / "data"),
            "QT_QPA_PLATFORM": "offscreen",
            "LANG": "C.UTF-8",
        }
        (tmp / "home").mkdir()
        shot = tmp / "window.png"

        def check(name: str, argv: list[str], verify, timeout_s: float) -> None:
            nonlocal failures
            t0 = time.monotonic()
            try:
                out = subprocess.run(
                    [str(exe), *argv], cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout_s
                )
            except subprocess.TimeoutExpired:
                print(f"FAIL {name}: no answer in {timeout_s:.0f} s")
                failures += 1
                return
            wall_s = time.monotonic() - t0
            try:
                if out.returncode != 0:
                    raise AssertionError(f"exit status {out.returncode}")
                detail = verify(out.stdout)
            except Exception as exc:  # report and go on with the next check
                print(f"FAIL {name} ({wall_s:.1f} s): {exc}")
                for line in (out.stderr.strip().splitlines() or ["(no stderr)"])[-8:]:
                    print(f"  | {line}")
                failures += 1
                return
            print(f"ok   {name} ({wall_s:.1f} s): {detail}")

        def version(stdout: str) -> str:
            assert "(bundle)" in stdout and "0c1e570" in stdout, stdout
            return " / ".join(stdout.strip().splitlines())

        def plan(stdout: str) -> str:
            doc = json.loads(stdout)
            host = doc["devices"][-1]
            return (
                f"{doc['model']['name']}, n_ctx {doc['effective']['n_ctx']}, KV {doc['kv_bytes'] / MIB:.2f} MiB, "
                f"host total {host['total_bytes'] / MIB:.1f} MiB"
            )

        def bench(stdout: str) -> str:
            doc = json.loads(stdout)
            decode = doc["decode_tok_s"]["median"]
            assert decode > 0, doc["decode_tok_s"]
            return (
                f"decode {decode:.1f} tok/s (n_gen {doc['n_gen']}), prefill {doc['prefill_tok_s']['median']:.1f} tok/s"
            )

        def gui(stdout: str) -> str:
            w, h = png_size_px(shot)
            assert w > 400 and h > 300, (w, h)
            return f"{shot.name} {w}x{h} px, {shot.stat().st_size / 1024:.0f} KiB"

        check("kvtuner --version", ["--version"], version, 60)
        check("kvtuner plan --json", ["plan", "--json"], plan, 900)  # first run: assembles the model, probes the CPU
        check("kvtuner bench -n 8 --json", ["bench", "-n", "8", "--json"], bench, 600)
        check("kvtuner gui --screenshot", ["gui", "--screenshot", str(shot)], gui, 300)
    print("smoke: all 4 checks passed" if not failures else f"smoke: {failures} of 4 checks failed")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
