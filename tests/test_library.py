"""Working-configs library: save completed runs, list best first per model and machine, restore."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kvtuner.cli import main
from kvtuner.core.export import GpuFingerprint, MachineFingerprint, ModelIdentity
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.store.library import ConfigLibrary, LibraryError, default_library_path, record_completed_run

MODEL_A = ModelIdentity("a.gguf", 1000, "aa" * 32, "llama", 32)
MODEL_A_RENAMED = ModelIdentity("a copy.gguf", 1000, "aa" * 32, "llama", 32)
MODEL_B = ModelIdentity("b.gguf", 2000, "bb" * 32, "gemma3", 18)
BOX_12G = MachineFingerprint("Linux 6.8", "x86_64", "Ryzen", 32 * 2**30, (GpuFingerprint("RTX 3060", 12 * 2**30),))
BOX_8G = MachineFingerprint("Linux 6.8", "x86_64", "Ryzen", 32 * 2**30, (GpuFingerprint("RTX 4060", 8 * 2**30),))


def _cfg(ctx: int) -> PlanConfig:
    return PlanConfig(n_ctx=ctx, type_k="q8_0", type_v="q8_0", flash_attn="on")


def test_data_dir_override_and_default_path(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTUNER_DATA_DIR", str(tmp_path / "d"))
    assert default_library_path() == tmp_path / "d" / "library.sqlite3"
    with ConfigLibrary() as lib:
        assert lib.path.exists()


def test_best_first_per_model_and_machine(tmp_path):
    with ConfigLibrary(tmp_path / "lib.sqlite3") as lib:
        slow = lib.save(MODEL_A, _cfg(4096), {"decode_tok_s": 10.0}, model_path="/m/a.gguf", machine=BOX_12G)
        fast = lib.save(
            MODEL_A,
            _cfg(8192),
            {"decode_tok_s": 30.5, "peak_vram_bytes": 5 * 2**30},
            model_path="/m/a.gguf",
            machine=BOX_12G,
        )
        unmeasured = lib.save(MODEL_A, _cfg(2048), {}, model_path="/m/a.gguf", machine=BOX_12G)
        lib.save(MODEL_A, _cfg(16384), {"decode_tok_s": 99.0}, model_path="/m/a.gguf", machine=BOX_8G)
        lib.save(MODEL_B, _cfg(4096), {"decode_tok_s": 50.0}, model_path="/m/b.gguf", machine=BOX_12G)

        runs = lib.known_good(MODEL_A, BOX_12G)
        assert [r.id for r in runs] == [fast, slow, unmeasured]  # no decode speed: last
        assert runs[0].config == _cfg(8192) and runs[0].measured == {"decode_tok_s": 30.5, "peak_vram_bytes": 5 * 2**30}
        assert runs[0].machine == BOX_12G and runs[0].model == MODEL_A and runs[0].decode_tok_s == 30.5
        # a renamed copy of the same file is the same model (size + header hash)
        assert [r.id for r in lib.known_good(MODEL_A_RENAMED, BOX_12G.fingerprint_id)] == [fast, slow, unmeasured]
        assert [r.decode_tok_s for r in lib.known_good(MODEL_A)] == [99.0, 30.5, 10.0, None]
        assert len(lib.known_good()) == 5
        assert len(lib.known_good(MODEL_A, BOX_12G, limit=1)) == 1

        assert lib.restore(fast) == (Path("/m/a.gguf"), _cfg(8192))
        assert lib.delete(slow) and not lib.delete(slow)
        with pytest.raises(KeyError, match="no saved configuration with id"):
            lib.get(slow)


def test_persists_across_processes(tmp_path):
    db = tmp_path / "lib.sqlite3"
    code = (
        "from kvtuner.core.store.library import ConfigLibrary\n"
        "from kvtuner.core.export import ModelIdentity, MachineFingerprint\n"
        "from kvtuner.core.plan.config import PlanConfig\n"
        f"lib = ConfigLibrary({str(db)!r})\n"
        "lib.save(ModelIdentity('a.gguf', 1, 'cc'), PlanConfig(n_ctx=1024), {'decode_tok_s': 3.0},"
        " model_path='/a.gguf', machine=MachineFingerprint('Linux', 'x86_64', '', 0))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with ConfigLibrary(db) as lib:
        (run,) = lib.known_good()
        assert run.config.n_ctx == 1024 and run.decode_tok_s == 3.0


def test_measured_must_be_numbers(tmp_path):
    with ConfigLibrary(tmp_path / "lib.sqlite3") as lib:
        with pytest.raises(ValueError, match="decode_tok_s must be a finite number >= 0"):
            lib.save(MODEL_A, _cfg(4096), {"decode_tok_s": -1.0}, model_path="/a", machine=BOX_12G)
        with pytest.raises(ValueError, match="load_s must be a number"):
            lib.save(MODEL_A, _cfg(4096), {"load_s": "3s"}, model_path="/a", machine=BOX_12G)
        # extra numeric figures from the runner are kept
        rid = lib.save(MODEL_A, _cfg(4096), {"decode_tok_s": 1.0, "n_tokens": 128}, model_path="/a", machine=BOX_12G)
        assert lib.get(rid).measured == {"decode_tok_s": 1.0, "n_tokens": 128}


def test_record_completed_run_opt_out(tmp_path, monkeypatch, default_profile):
    db = tmp_path / "lib.sqlite3"
    assert (
        record_completed_run(default_profile, _cfg(4096), {"decode_tok_s": 5.0}, enabled=False, library_path=db) is None
    )
    monkeypatch.setenv("KVTUNER_LIBRARY", "off")
    assert record_completed_run(default_profile, _cfg(4096), {"decode_tok_s": 5.0}, library_path=db) is None
    monkeypatch.delenv("KVTUNER_LIBRARY")
    rid = record_completed_run(default_profile, _cfg(4096), {"decode_tok_s": 5.0}, library_path=db, machine=BOX_12G)
    with ConfigLibrary(db) as lib:
        (run,) = lib.known_good(ModelIdentity.from_profile(default_profile), BOX_12G)
        assert run.id == rid and run.model_path == default_profile.path


def test_damaged_or_newer_database_is_a_clear_error(tmp_path):
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LibraryError, match=r"not a readable kvtuner library .* move it away"):
        ConfigLibrary(junk)
    newer = tmp_path / "newer.sqlite3"
    con = sqlite3.connect(newer)
    con.execute("PRAGMA user_version = 99")
    con.close()
    with pytest.raises(LibraryError, match="newer kvtuner"):
        ConfigLibrary(newer)
    (tmp_path / "file").write_text("x")  # a file where the folder should be
    with pytest.raises(LibraryError, match="cannot open the configs library"):
        ConfigLibrary(tmp_path / "file" / "sub" / "lib.sqlite3")


def test_broken_row_is_skipped_not_fatal(tmp_path):
    db = tmp_path / "lib.sqlite3"
    with ConfigLibrary(db) as lib:
        good = lib.save(MODEL_A, _cfg(4096), {"decode_tok_s": 2.0}, model_path="/a", machine=BOX_12G)
        bad = lib.save(MODEL_A, _cfg(4096), {"decode_tok_s": 9.0}, model_path="/a", machine=BOX_12G)
    con = sqlite3.connect(db)
    with con:
        con.execute("UPDATE runs SET config_json = '{\"n_ctx\": -1}' WHERE id = ?", (bad,))
    con.close()
    with ConfigLibrary(db) as lib:
        assert [r.id for r in lib.known_good(MODEL_A, BOX_12G)] == [good]


def test_cli_library_and_export_from_library(default_profile, capsys):
    here = MachineFingerprint.current()
    rid = record_completed_run(
        default_profile, _cfg(8192), {"decode_tok_s": 42.0, "peak_vram_bytes": 2**30}, machine=here
    )
    assert main(["library"]) == 0
    out = capsys.readouterr().out
    assert f"{rid:>5}" in out and "42.0" in out and "q8_0/q8_0" in out and "1.00 GiB" in out
    assert main(["export", "--from-library", str(rid), "--format", "llama-server"]) == 0
    assert " -c 8192 " in capsys.readouterr().out
    assert main(["export", "--from-library", "999", "--format", "llama-server"]) == 2
    assert "no saved configuration with id 999" in capsys.readouterr().err


def test_id_beyond_sqlite_integer_is_not_found(tmp_path, capsys, monkeypatch):
    """`--from-library 99999999999999999999999` used to end in an OverflowError traceback."""
    with ConfigLibrary(tmp_path / "lib.sqlite3") as lib:
        with pytest.raises(KeyError, match="no saved configuration"):
            lib.get(10**23)
        assert lib.delete(10**23) is False
    monkeypatch.setenv("KVTUNER_DATA_DIR", str(tmp_path))
    assert main(["export", "--from-library", str(10**23), "--format", "llama-server"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvtuner: no saved configuration") and err.count("\n") == 1


def test_locked_library_says_busy_not_move_it_away(tmp_path):
    """A library locked by another process (the app saving a run) is fine: the error must not
    tell the user to move it away."""
    path = tmp_path / "lib.sqlite3"
    ConfigLibrary(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(LibraryError, match=r"busy .*try again") as info:
            ConfigLibrary(path, timeout=0.1)
        assert "move it away" not in str(info.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    ConfigLibrary(path).close()
