"""Desktop app: the Export dialog with the real export API for every target, opening kvtuner
profiles (good, from elsewhere, malformed), and the Known good panel over the real SQLite
library (restore applies a saved configuration). Offscreen Qt, no llama.cpp needed."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import json
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6 import QtCore, QtWidgets

from kvtuner.core.export import TARGETS, MachineFingerprint, ModelIdentity, export, write_text_atomic
from kvtuner.core.plan.config import PlanConfig
from kvtuner.core.store.library import ConfigLibrary
from kvtuner.core.units import GiB
from kvtuner.testing.cli import run_kvtuner
from kvtuner.testing.gui_support import HOST, NO_MODEL

MEASURED = {
    "decode_tok_s": 41.5,
    "prefill_tok_s": 900.0,
    "load_s": 0.8,
    "peak_rss_bytes": 600 << 20,
    "kv_bytes": 3 << 20,
}


def _without_time(text: str) -> str:
    """A profile's text without its creation time (two exports a second apart differ there)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    doc.pop("created_utc", None)
    return json.dumps(doc, sort_keys=True)


# -- export dialog ----------------------------------------------------------------------------------


def test_export_action_opens_the_dialog_and_every_target_matches_the_export_api(qtbot, settings, what_if_window):
    config = PlanConfig(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on", n_gpu_layers=10)
    w = what_if_window(config)
    assert w.export_action.isEnabled()
    w.export_action.trigger()
    dialogs = [d for d in w.findChildren(QtWidgets.QDialog) if d.isVisible()]
    assert len(dialogs) == 1
    dlg = dialogs[0]
    qtbot.addWidget(dlg)
    assert [dlg.target.itemText(i) for i in range(dlg.target.count())] == list(TARGETS)
    assert dlg.preview.isReadOnly()
    assert (
        dlg.preview.font().fixedPitch()
        or dlg.preview.font().styleHint() == dlg.preview.font().StyleHint.TypeWriter
        or "mono" in dlg.preview.font().family().lower()
    )
    for target in TARGETS:
        dlg.target.setCurrentText(target)
        expected = export(target, w.model_path, w.config, model=w.model, machine=w.machine)
        assert dlg.error == ""
        assert _without_time(dlg.preview.toPlainText()) == _without_time(expected.text), target
        shown = dlg.limitation_lines()
        for lim in expected.limitations:
            assert lim in shown, (target, lim)
        assert dlg.experimental.isVisibleTo(dlg) == expected.experimental
        assert dlg.copy_button.isEnabled() and dlg.save_button.isEnabled()
    dlg.target.setCurrentText("ollama")  # q8_0 K and V: Ollama needs the server environment
    assert any("OLLAMA_KV_CACHE_TYPE" in line for line in dlg.limitation_lines())
    dlg.copy()
    assert QtWidgets.QApplication.clipboard().text() == dlg.result.text


def test_a_partial_kv_split_shows_the_experimental_badge(qtbot, settings, what_if_window):
    w = what_if_window(PlanConfig(n_gpu_layers=10, kv_gpu_layers=4))
    dlg = w.open_export()
    qtbot.addWidget(dlg)
    dlg.target.setCurrentText("llama-server")
    assert dlg.result.experimental and dlg.experimental.isVisibleTo(dlg)
    assert "-ot" in dlg.result.argv
    dlg.target.setCurrentText("ollama")  # Ollama cannot place part of the KV cache: said, not hidden
    assert dlg.limitation_lines() and dlg.limitation_lines() != ["Nothing: this export is exact."]


def test_save_writes_atomically_and_asks_before_replacing(qtbot, settings, tmp_path, what_if_window):
    w = what_if_window()
    dlg = w.open_export()
    qtbot.addWidget(dlg)
    dlg.target.setCurrentText("koboldcpp")
    out = tmp_path / "my model.kcpps"
    asked: list[str] = []
    dlg.ask_save_path = lambda start: (asked.append(start), str(out))[1]
    dlg.ask_overwrite = lambda p: pytest.fail("nothing to overwrite yet")
    dlg.save_button.click()
    assert asked and asked[0].endswith(dlg.result.filename_suggestion)
    assert out.read_text(encoding="utf-8") == dlg.result.text
    # the file exists now: declining keeps it, accepting replaces it
    dlg.target.setCurrentText("llama-server")
    questions: list[str] = []
    dlg.ask_overwrite = lambda p: (questions.append(p), False)[1]
    dlg.save_button.click()
    assert questions == [str(out)]
    assert out.read_text(encoding="utf-8") != dlg.result.text
    dlg.ask_overwrite = lambda p: True
    assert dlg.save() == out
    assert out.read_text(encoding="utf-8") == dlg.result.text
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_the_default_overwrite_question_is_a_real_message_box(qtbot, settings, tmp_path, what_if_window):
    w = what_if_window()
    dlg = w.open_export()
    qtbot.addWidget(dlg)
    out = tmp_path / "run.sh"
    out.write_text("old\n")

    def answer(button):
        def press():
            box = QtWidgets.QApplication.activeModalWidget()
            assert isinstance(box, QtWidgets.QMessageBox), box
            assert str(out) in box.text()
            box.button(button).click()

        QtCore.QTimer.singleShot(50, press)

    answer(QtWidgets.QMessageBox.StandardButton.No)
    assert dlg.save_to(str(out)) is None
    assert out.read_text() == "old\n"
    answer(QtWidgets.QMessageBox.StandardButton.Yes)
    assert dlg.save_to(str(out)) == out
    assert out.read_text() == "#!/bin/sh\n" + dlg.result.text  # a .sh export is a script
    assert out.stat().st_mode & 0o100


def test_profile_export_carries_the_last_runs_measured_numbers_only_for_that_configuration(
    qtbot, settings, what_if_window
):
    w = what_if_window()
    w.last_run = (w.model_path, w.config, dict(MEASURED))  # as a completed run leaves it
    dlg = w.open_export()
    qtbot.addWidget(dlg)
    dlg.target.setCurrentText("profile")
    doc = json.loads(dlg.preview.toPlainText())
    assert doc["measured"]["decode_tok_s"] == pytest.approx(41.5)
    expected = export("profile", w.model_path, w.config, model=w.model, measured=MEASURED, machine=w.machine)
    assert _without_time(dlg.result.text) == _without_time(expected.text)
    w.controls.ctx.slider.setValue(w.controls.ctx.slider.value() + 8)  # another configuration: not measured
    dlg2 = w.open_export()
    qtbot.addWidget(dlg2)
    dlg2.target.setCurrentText("profile")
    assert json.loads(dlg2.preview.toPlainText())["measured"] == {}
    assert "no measured numbers" in dlg2.description.text()


# -- opening profiles -------------------------------------------------------------------------------


def _profile(
    tmp_path: Path,
    model_path: Path,
    config: PlanConfig,
    *,
    machine: MachineFingerprint | None = None,
    name: str = "tuned.kvtuner.json",
) -> Path:
    result = export("profile", model_path, config, measured=MEASURED, machine=machine)
    return write_text_atomic(tmp_path / name, result.text)


def test_file_open_accepts_a_profile_and_applies_its_configuration(
    qtbot, settings, tmp_path, default_model, what_if_window
):
    config = PlanConfig(n_ctx=16384, type_k="q8_0", type_v="q8_0", flash_attn="on", n_gpu_layers=7)
    path = _profile(tmp_path, default_model, config, machine=MachineFingerprint.current(gpus=[]))
    w = what_if_window(model=NO_MODEL)
    w.open_path(path)
    qtbot.waitUntil(lambda: w.model is not None and w.plan is not None, timeout=30_000)
    assert w.config == config
    assert w.controls.config() == config
    assert w.plan.config == config
    assert w.model_path == default_model
    assert w.last_error == ""


def test_a_profile_from_another_machine_opens_with_its_warnings_shown(
    qtbot, settings, tmp_path, default_model, what_if_window
):
    other = MachineFingerprint(os="Linux 6.1", arch="x86_64", cpu="Some Other CPU", ram_total_bytes=64 * GiB, gpus=())
    config = PlanConfig(n_ctx=2048)
    path = _profile(tmp_path, default_model, config, machine=other)
    w = what_if_window()
    w.open_path(path)
    qtbot.waitUntil(lambda: bool(w.profile_warnings) and w.config == config, timeout=30_000)
    assert any("another machine" in x for x in w.profile_warnings)
    assert w.advisor.notes.isVisibleTo(w) and "another machine" in w.advisor.notes.text()
    assert "another machine" in w.status.currentMessage()
    w.open_model(None)  # opening a plain model clears the profile's notes
    assert not w.advisor.notes.isVisibleTo(w)


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"kvtuner_profile": 1, "model": 3}', b"\xff\xfe\x00junk", b'{"kvtuner_profile": 99}'],
)
def test_a_malformed_profile_shows_one_line_and_changes_nothing(qtbot, settings, tmp_path, content, what_if_window):
    w = what_if_window(PlanConfig(n_ctx=4096))
    before_model, before_config = w.model_path, w.config
    bad = tmp_path / "broken.json"
    bad.write_bytes(content)
    w.open_path(bad)
    qtbot.waitUntil(lambda: bool(w.last_error), timeout=10_000)
    assert w.last_error.startswith("Could not open profile broken.json: ")
    assert "\n" not in w.last_error and "Traceback" not in w.last_error
    assert w.banner.isVisibleTo(w)
    assert w.model_path == before_model and w.config == before_config
    w.controls.ctx.slider.setValue(w.controls.ctx.slider.value() + 8)  # still working
    assert w.plan.config.n_ctx == w.config.n_ctx


@pytest.mark.slow
def test_gui_command_line_opens_a_profile(tmp_path, default_model):
    """``kvtuner gui PROFILE.json --screenshot``: a real process opens the profile."""

    path = _profile(tmp_path, default_model, PlanConfig(n_ctx=2048), machine=MachineFingerprint.current(gpus=[]))
    shot = tmp_path / "shot.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    proc = run_kvtuner("gui", str(path), "--screenshot", str(shot), env=env, timeout=180, module="kvtuner")
    assert proc.returncode == 0, proc.stderr
    assert shot.stat().st_size > 10_000
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    proc = run_kvtuner("gui", str(bad), "--screenshot", str(shot), env=env, timeout=180, module="kvtuner")
    assert proc.returncode == 1
    assert "Could not open profile bad.json" in proc.stderr and "Traceback" not in proc.stderr


# -- known good -------------------------------------------------------------------------------------


def _save(model, config: PlanConfig, decode: float | None, machine: MachineFingerprint) -> int:
    measured = dict(MEASURED)
    if decode is None:
        measured.pop("decode_tok_s")
    else:
        measured["decode_tok_s"] = decode
    with ConfigLibrary() as lib:
        return lib.save(ModelIdentity.from_profile(model), config, measured, model_path=model.path, machine=machine)


def test_known_good_lists_this_models_runs_best_first_and_restore_applies_one(
    qtbot, settings, default_profile, what_if_window
):
    here = MachineFingerprint.current(gpus=[])
    elsewhere = MachineFingerprint(os="Linux", arch="x86_64", cpu="Other", ram_total_bytes=1 << 30, gpus=())
    slow = _save(default_profile, PlanConfig(n_ctx=1024), 5.0, here)
    fast = _save(default_profile, PlanConfig(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on"), 50.0, here)
    _save(default_profile, PlanConfig(n_ctx=2048), None, here)
    _save(default_profile, PlanConfig(n_ctx=512), 99.0, elsewhere)  # another machine: not listed
    w = what_if_window()
    panel = w.known_good
    qtbot.waitUntil(lambda: len(panel.runs) == 3, timeout=10_000)
    assert [r.id for r in panel.runs][:2] == [fast, slow]
    assert panel.table.rowCount() == 3 and panel.table.item(0, 0).text() == "50.0 tok/s"
    assert panel.table.item(0, 1).text() == "8,192"
    assert "(3)" in panel.title()
    assert panel.table.currentRow() == 0 and panel.restore_button.isEnabled()
    panel.restore_button.click()
    want = PlanConfig(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on")
    assert w.config == want and w.controls.config() == want and w.plan.config == want
    panel.table.cellDoubleClicked.emit(1, 0)
    assert w.config == PlanConfig(n_ctx=1024)


def test_known_good_merges_duplicates_shows_every_knob_and_deletes(qtbot, settings, default_profile, what_if_window):
    here = MachineFingerprint.current(gpus=[])
    same = PlanConfig(n_ctx=2048, n_seq=2, n_ubatch=256)
    _save(default_profile, same, 20.0, here)
    _save(default_profile, same, 30.0, here)
    other = _save(default_profile, PlanConfig(n_ctx=1024), 10.0, here)
    w = what_if_window()
    panel = w.known_good
    qtbot.waitUntil(lambda: len(panel.runs) == 3, timeout=10_000)
    headers = [panel.table.horizontalHeaderItem(i).text() for i in range(panel.table.columnCount())]
    assert {"KV on GPU", "-np", "-ub", "runs", "saved"} <= set(headers)
    assert panel.table.rowCount() == 2 and "(2)" in panel.title()  # the two runs of `same` are one row
    row = {h: panel.table.item(0, i).text() for i, h in enumerate(headers)}
    assert row["decode"] == "30.0 tok/s" and row["runs"] == "2" and row["-np"] == "2" and row["-ub"] == "256"
    assert row["KV on GPU"] == "all" and len(row["saved"]) == 10
    panel.table.selectRow(0)
    panel.delete_button.click()  # both runs of the row leave the library
    qtbot.waitUntil(lambda: len(panel.runs) == 1, timeout=10_000)
    assert [r.id for r in panel.runs] == [other]
    with ConfigLibrary() as lib:
        assert [r.id for r in lib.known_good(ModelIdentity.from_profile(default_profile), here)] == [other]


def test_known_good_is_empty_with_an_explanation_and_the_setting_persists(qtbot, settings, what_if_window, make_window):
    w = what_if_window()
    qtbot.waitUntil(lambda: w.tasks.pending == 0, timeout=10_000)
    assert w.known_good.runs == [] and "Nothing saved" in w.known_good.message.text()
    assert w.known_good.remember.isChecked() and w.remember_working_configs
    w.known_good.remember.setChecked(False)
    w.close()
    w2 = make_window(settings=settings, hardware=([], HOST, ""), model=NO_MODEL)
    assert not w2.known_good.remember.isChecked()


def test_library_off_in_the_environment_disables_the_setting(qtbot, settings, monkeypatch, what_if_window):
    monkeypatch.setenv("KVTUNER_LIBRARY", "off")
    w = what_if_window(model=NO_MODEL)
    assert not w.known_good.remember.isEnabled()
    assert "KVTUNER_LIBRARY=off" in w.known_good.remember.toolTip()
