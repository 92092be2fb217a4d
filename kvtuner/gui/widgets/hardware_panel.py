"""Hardware: the detected GPUs and RAM, or a what-if GPU: a named card of the catalogue
(:mod:`kvtuner.core.hardware.gpu_catalogue`, its figures shown), a generic card of a memory size
(8/12/16/24/48 GB, or a custom size); and the host the speed is predicted for: this machine, or a
what-if host (its memory, cores and PCIe link).

On a machine without a GPU the plan is for this machine (CPU only) by default: a what-if card is
an explicit choice (a default what-if card predicted 464 tok/s for the default model where this
CPU measured 64-86)."""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

from ...core.hardware.gpu_catalogue import GPU_CATALOGUE
from ...core.hardware.specs import GPU_PRESETS_BYTES, GpuSpec, HostSpec, catalogue_gpu, what_if_gpu
from ...core.units import GiB, fmt_bytes

DETECTED = "detected"
CPU_ONLY = "cpu"
CUSTOM = "custom"
#: Choice prefix of a catalogue card (``card:RTX 3090``).
CARD = "card:"
#: A what-if card (tests and the documentation's examples choose it explicitly).
DEFAULT_WHAT_IF = CARD + "RTX 3060 12GB"
#: Item data role of the short text the closed "Plan for" box shows (the list shows the full one).
SHORT_TEXT_ROLE = int(QtCore.Qt.ItemDataRole.UserRole) + 1


class ChoiceBox(QtWidgets.QComboBox):
    """A combo box whose closed face shows each item's short text (:data:`SHORT_TEXT_ROLE`,
    e.g. "RTX 3060 12GB (what-if)") while its list shows the full one with the card's figures,
    so the choice reads whole in the narrow left column."""

    def displayed_text(self) -> str:
        """The text the closed box shows."""
        return str(self.currentData(SHORT_TEXT_ROLE) or self.currentText())

    def text_rect_width(self) -> int:
        """Pixels the closed box has for its text."""
        opt = QtWidgets.QStyleOptionComboBox()
        self.initStyleOption(opt)
        return (
            self.style()
            .subControlRect(
                QtWidgets.QStyle.ComplexControl.CC_ComboBox, opt, QtWidgets.QStyle.SubControl.SC_ComboBoxEditField, self
            )
            .width()
        )

    def paintEvent(self, event: QtGui.QPaintEvent) -> None:  # noqa: N802 (Qt API)
        painter = QtWidgets.QStylePainter(self)
        opt = QtWidgets.QStyleOptionComboBox()
        self.initStyleOption(opt)
        opt.currentText = self.fontMetrics().elidedText(
            self.displayed_text(), QtCore.Qt.TextElideMode.ElideRight, max(self.text_rect_width(), 1)
        )
        painter.drawComplexControl(QtWidgets.QStyle.ComplexControl.CC_ComboBox, opt)
        painter.drawControl(QtWidgets.QStyle.ControlElement.CE_ComboBoxLabel, opt)


def _gpu_text(g: GpuSpec) -> str:
    """One detected GPU: ``CUDA0 NVIDIA ..., 24.00 GiB`` or ``ROCm1 AMD Strix Halo iGPU, 120.50 GiB
    (one pool with the CPU; sysfs)``, with a contradictory reading said so."""
    device = g.backend_device
    notes = [
        n
        for n in (
            "one pool with the CPU" if g.unified else "",
            g.source.split()[0] if g.source and g.source != "nvml" else "",
            "reading contradicts itself, not trusted" if g.flags else "",
        )
        if n
    ]
    return f"{device} {g.name}, {fmt_bytes(g.total_bytes)}" + (f" ({'; '.join(notes)})" if notes else "")


class HardwarePanel(QtWidgets.QGroupBox):
    """Which devices the plan is laid out on. Emits :attr:`changed` when the choice changes.

    Args:
        gpus: detected GPUs (from :func:`kvtuner.core.hardware.nvml.detect_gpus`).
        host: the host (:func:`kvtuner.core.hardware.host.detect_host`).
        gpu_note: why no GPU was found (shown when ``gpus`` is empty).
    """

    changed = QtCore.Signal()

    def __init__(
        self, gpus: list[GpuSpec], host: HostSpec, gpu_note: str = "", parent: QtWidgets.QWidget | None = None
    ) -> None:
        super().__init__("Hardware", parent)
        self._detected = list(gpus)
        self._host = host
        form = QtWidgets.QFormLayout(self)
        form.setVerticalSpacing(2)
        self.detected_label = QtWidgets.QLabel()
        self.detected_label.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.detected_label.setWordWrap(True)
        if gpus:
            self.detected_label.setText("; ".join(_gpu_text(g) for g in gpus))
        else:
            self.detected_label.setText(
                "no GPU found"
                + (f" ({gpu_note})" if gpu_note else "")
                + ': this machine plans CPU only; a what-if card in "Plan for" '
                "shows what one would hold"
            )
        form.addRow("GPU", self.detected_label)
        self.ram_label = QtWidgets.QLabel(
            f"{fmt_bytes(host.total_bytes)} total, {fmt_bytes(host.available_bytes)} available, "
            f"swap {fmt_bytes(host.swap_total_bytes)}"
        )
        form.addRow("RAM", self.ram_label)

        self.choice = ChoiceBox()

        def short(text: str) -> None:
            self.choice.setItemData(self.choice.count() - 1, text, SHORT_TEXT_ROLE)

        if gpus:
            self.choice.addItem(f"detected GPU{'s' if len(gpus) > 1 else ''}", DETECTED)
        for g in GPU_CATALOGUE.values():
            self.choice.addItem(
                f"what-if {g.name} ({g.vram_bytes / GiB:g} GiB, {g.mem_bandwidth_bytes_s / 1e9:.0f} GB/s)",
                CARD + g.name,
            )
            short(f"{g.name} (what-if)")
            self.choice.setItemData(
                self.choice.count() - 1, g.describe() + "\nsource: " + g.source, QtCore.Qt.ItemDataRole.ToolTipRole
            )
        from ...core.speed.speed_model import GENERIC_CARDS

        for name, size in GPU_PRESETS_BYTES.items():
            like = GENERIC_CARDS.get(size)
            bw = GPU_CATALOGUE[like].mem_bandwidth_bytes_s / 1e9 if like in GPU_CATALOGUE else None
            self.choice.addItem(
                f"what-if generic {name} GPU"
                + (f" (speed of an {like}, {bw:.0f} GB/s)" if bw else (f" (speed of an {like})" if like else "")),
                name,
            )
            short(f"generic {name} GPU (what-if)")
        self.choice.addItem("what-if custom size (generic card)", CUSTOM)
        short("custom size (what-if)")
        self.choice.addItem("CPU only (no GPU)", CPU_ONLY)
        self.choice.setToolTip(
            "The devices the plan is laid out on. Without a GPU, llama.cpp keeps every layer on\n"
            "the CPU whatever -ngl says; a what-if GPU shows what a card of that size would hold."
        )
        # the long card names must not widen the left column: the list itself is wide enough
        self.choice.setSizeAdjustPolicy(QtWidgets.QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.choice.setMinimumContentsLength(18)
        self.choice.view().setMinimumWidth(self.choice.view().sizeHintForColumn(0) + 24)
        self.custom = QtWidgets.QDoubleSpinBox()
        self.custom.setRange(0.5, 1024)
        self.custom.setDecimals(1)
        self.custom.setSingleStep(1.0)
        self.custom.setValue(10.0)
        self.custom.setSuffix(" GiB")
        self.custom.setKeyboardTracking(False)
        self.custom.setToolTip("Capacity of the what-if GPU (a '12 GB' card holds 12 GiB).")
        row = QtWidgets.QWidget()
        rl = QtWidgets.QHBoxLayout(row)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.choice, 1)
        rl.addWidget(self.custom)
        label = QtWidgets.QLabel("Pla&n for")
        label.setBuddy(self.choice)
        form.addRow(label, row)
        self.figures = QtWidgets.QLabel()
        self.figures.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.figures.setWordWrap(True)
        self.figures.setToolTip("The figures the speed prediction uses for the chosen card (vendor specifications).")
        form.addRow("Card", self.figures)
        self._build_host_row(form)
        self.set_choice(DETECTED if gpus else CPU_ONLY)
        self._show_figures()
        self.choice.currentIndexChanged.connect(self._on_choice_changed)
        self.custom.valueChanged.connect(self._on_choice_changed)

    def _build_host_row(self, form: QtWidgets.QFormLayout) -> None:
        """The host part of "Plan for": its memory (this machine's, or a named configuration of
        :mod:`kvtuner.core.hardware.memory_catalogue`), its physical cores (0: this machine's) and
        the GPUs' PCIe link (the card's own, or a slot such as 3.0 x4 for a Thunderbolt eGPU)."""
        from ...core.hardware.memory_catalogue import EXAMPLE_CONFIGS, parse_host_memory
        from ...core.speed.speed_model import HOST_DECODE_BW_SHARE

        self.host_mem = QtWidgets.QComboBox()
        self.host_mem.addItem("this machine's RAM", None)
        for name in EXAMPLE_CONFIGS:
            m = parse_host_memory(name)
            self.host_mem.addItem(f"{name} ({m.typical_bytes_s / 1e9:.0f} GB/s)", name)
            self.host_mem.setItemData(
                self.host_mem.count() - 1,
                f"{m.theoretical_bytes_s / 1e9:.1f} GB/s theoretical, {m.typical_bytes_s / 1e9:.1f} "
                f"GB/s typical achieved\nsource: {m.source}",
                QtCore.Qt.ItemDataRole.ToolTipRole,
            )
        self.host_mem.setToolTip(
            "The host RAM the speed is predicted for (--host-mem): CPU-side weights, experts\n"
            f"and KV stream at {HOST_DECODE_BW_SHARE:g} of its achieved bandwidth (llama.cpp's CPU decode share)."
        )
        self.host_cores = QtWidgets.QSpinBox()
        self.host_cores.setRange(0, 1024)
        self.host_cores.setSpecialValueText("own cores")
        self.host_cores.setSuffix(" cores")
        self.host_cores.setToolTip("Physical cores llama.cpp uses on that host (--host-cores); 0: this machine's.")
        self.host_pcie = QtWidgets.QComboBox()
        self.host_pcie.addItem("card's own PCIe link", None)
        for gen, lanes in ((5, 16), (4, 16), (4, 8), (4, 4), (3, 16), (3, 4)):
            self.host_pcie.addItem(
                f"PCIe {gen}.0 x{lanes}" + (" (eGPU)" if (gen, lanes) == (3, 4) else ""), f"{gen}x{lanes}"
            )
        self.host_pcie.setToolTip("The GPUs' link on that host (--pcie): host weights cross it in prefill.")
        # the long item texts must not widen the left column (it fits a 1280-pixel screen): the
        # boxes shrink to a few characters, their lists stay as wide as their items
        for box, chars in ((self.host_mem, 10), (self.host_pcie, 8)):
            box.setSizeAdjustPolicy(QtWidgets.QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            box.setMinimumContentsLength(chars)
            box.view().setMinimumWidth(box.view().sizeHintForColumn(0) + 24)
        row = QtWidgets.QWidget()
        rl = QtWidgets.QHBoxLayout(row)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.host_mem, 2)
        rl.addWidget(self.host_cores, 1)
        rl.addWidget(self.host_pcie, 1)
        # Alt+I: every letter of "Host" is another control's Alt key already
        label = QtWidgets.QLabel("Host mach&ine")
        label.setBuddy(self.host_mem)
        form.addRow(label, row)
        self._machine_bw: float | None = self._host.mem_bandwidth_bytes_s if not self._host.what_if else None
        for w in (self.host_mem, self.host_pcie):
            w.currentIndexChanged.connect(self._on_host_changed)
        self.host_cores.valueChanged.connect(self._on_host_changed)

    def _on_host_changed(self, *_: object) -> None:
        self.changed.emit()

    def host_for(self, host: HostSpec) -> HostSpec:
        """``host`` (this machine's RAM and CPU) as the host part of "Plan for" describes it:
        unchanged for this machine, else a what-if host (:class:`HostSpec` ``what_if``) with the
        chosen memory's typical bandwidth, cores and PCIe link."""
        from dataclasses import replace

        from ...core.hardware.memory_catalogue import parse_host_memory

        if not host.what_if:
            self._machine_bw = host.mem_bandwidth_bytes_s
        mem, cores, link = self.host_mem.currentData(), self.host_cores.value(), self.host_pcie.currentData()
        if mem is None and not cores and link is None:
            return replace(
                host,
                what_if=False,
                memory=None,
                mem_theoretical_bytes_s=None,
                n_cores=None,
                pcie_link=None,
                mem_bandwidth_bytes_s=self._machine_bw if host.what_if else host.mem_bandwidth_bytes_s,
            )
        pcie = tuple(int(x) for x in link.split("x")) if link else None
        changes: dict = {"what_if": True, "n_cores": cores or None, "pcie_link": pcie}
        if isinstance(mem, str) and mem.startswith("bw:"):
            changes.update(memory=None, mem_theoretical_bytes_s=None, mem_bandwidth_bytes_s=float(mem[3:]))
        elif mem is not None:
            m = parse_host_memory(mem)
            changes.update(
                memory=m.name, mem_theoretical_bytes_s=m.theoretical_bytes_s, mem_bandwidth_bytes_s=m.typical_bytes_s
            )
        else:
            changes.update(memory=None, mem_theoretical_bytes_s=None, mem_bandwidth_bytes_s=None)
        return replace(host, **changes)

    def set_what_if_host(self, host: HostSpec) -> None:
        """Show a what-if host (``kvtuner gui --host-mem ...``) in the host part without emitting
        :attr:`changed`: its memory (added to the list when it is not there, or as a bandwidth),
        cores and link."""
        if not host.what_if:
            return
        widgets = (self.host_mem, self.host_cores, self.host_pcie)
        for w in widgets:
            w.blockSignals(True)
        if host.memory:
            i = self.host_mem.findData(host.memory)
            if i < 0:
                self.host_mem.addItem(
                    f"{host.memory} ({(host.mem_bandwidth_bytes_s or 0) / 1e9:.0f} GB/s)", host.memory
                )
                i = self.host_mem.count() - 1
            self.host_mem.setCurrentIndex(i)
        elif host.mem_bandwidth_bytes_s:
            self.host_mem.addItem(
                f"RAM at {host.mem_bandwidth_bytes_s / 1e9:.0f} GB/s (given)", f"bw:{host.mem_bandwidth_bytes_s}"
            )
            self.host_mem.setCurrentIndex(self.host_mem.count() - 1)
        self.host_cores.setValue(host.n_cores or 0)
        if host.pcie_link:
            key = f"{host.pcie_link[0]}x{host.pcie_link[1]}"
            i = self.host_pcie.findData(key)
            if i < 0:
                self.host_pcie.addItem(f"PCIe {host.pcie_link[0]}.0 x{host.pcie_link[1]}", key)
                i = self.host_pcie.count() - 1
            self.host_pcie.setCurrentIndex(i)
        for w in widgets:
            w.blockSignals(False)

    def host(self) -> HostSpec:
        """The host the plan uses."""
        return self._host

    def set_host(self, host: HostSpec) -> None:
        """The host again, its available RAM measured now (the label follows)."""
        self._host = host
        self.ram_label.setText(
            f"{fmt_bytes(host.total_bytes)} total, {fmt_bytes(host.available_bytes)} available, "
            f"swap {fmt_bytes(host.swap_total_bytes)}"
        )

    def detected_gpus(self) -> list[GpuSpec]:
        """GPUs found on this machine."""
        return list(self._detected)

    def current_choice(self) -> str:
        """``detected``, a catalogue card (``card:RTX 3090``), a generic size (``12 GB``), ``custom`` or ``cpu``."""
        return str(self.choice.currentData())

    def custom_bytes(self) -> int:
        """Size of the custom what-if GPU in bytes."""
        return int(round(self.custom.value() * GiB))

    def set_choice(self, choice: str, custom_bytes: int | None = None) -> None:
        """Select a choice without emitting :attr:`changed` (unknown choices are ignored)."""
        i = self.choice.findData(choice)
        if i < 0:
            return
        for w in (self.choice, self.custom):
            w.blockSignals(True)
        self.choice.setCurrentIndex(i)
        if custom_bytes:
            self.custom.setValue(custom_bytes / GiB)
        self.custom.setEnabled(choice == CUSTOM)
        self.custom.setVisible(choice == CUSTOM)  # the size box only for a custom size: the choice reads whole
        for w in (self.choice, self.custom):
            w.blockSignals(False)
        self._show_figures()

    def gpus(self) -> list[GpuSpec]:
        """The GPUs to plan for."""
        c = self.current_choice()
        if c == DETECTED:
            return list(self._detected)
        if c == CPU_ONLY:
            return []
        if c == CUSTOM:
            return [what_if_gpu(self.custom_bytes())]
        if c.startswith(CARD):
            return [catalogue_gpu(c[len(CARD) :])]
        return [what_if_gpu(GPU_PRESETS_BYTES[c])]

    def _show_figures(self) -> None:
        """The chosen card's figures (the catalogue entry the speed model uses)."""
        from ...core.speed.speed_model import catalogue_entry

        gpus = self.gpus()
        if not gpus:
            self.figures.setText("none: every layer on the CPU")
            return
        lines = []
        for g in gpus:
            e = catalogue_entry(g)
            own = g.catalogue == e.name
            lines.append(e.describe() if own else f"{g.name}: rates of the {e.name} ({e.describe().split(': ', 1)[1]})")
        self.figures.setText("\n".join(lines))

    def _on_choice_changed(self, *_: object) -> None:
        self.custom.setEnabled(self.current_choice() == CUSTOM)
        self.custom.setVisible(self.current_choice() == CUSTOM)
        self._show_figures()
        self.changed.emit()
