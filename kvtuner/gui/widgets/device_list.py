"""Several devices: extra what-if cards and llama.cpp RPC hosts next to the Hardware panel's
choice, and how the layers are split over all of them (``-sm``, ``-ts`` sliders, ``-mg``).

The devices are listed in llama.cpp's order (src/llama.cpp ``llama_prepare_model_devices``: RPC
servers first, then the local GPUs), which is the order ``-ts`` and ``-mg`` index; the split rule
itself is :func:`kvtuner.core.plan.placement.device_layer_split`.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6 import QtCore, QtWidgets

from ...core.hardware.gpu_catalogue import GPU_CATALOGUE
from ...core.hardware.rpc import RpcError, query_endpoint, rpc_devices, what_if_rpc_device
from ...core.hardware.specs import GpuSpec, catalogue_gpu
from ...core.plan.config import ConfigError
from ...core.plan.memory_plan import order_devices
from ...core.plan.placement import DeviceSplit
from ...core.units import fmt_bytes

#: Slider steps per device (a -ts share of 0..SLIDER_MAX).
SLIDER_MAX = 100
#: The card list's first entry: nothing is chosen until the user picks a card.
ADD_CARD_PLACEHOLDER = "Add a card..."


class DeviceListPanel(QtWidgets.QGroupBox):
    """Extra devices and the split. Emits :attr:`changed` when either changes.

    :meth:`set_base` tells it the Hardware panel's GPUs; :meth:`devices` returns those plus the
    extra ones (local cards numbered after them), :meth:`split` the :class:`DeviceSplit`.
    """

    changed = QtCore.Signal()

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__("Several devices (-sm / -ts / -mg, --rpc)", parent)
        self._base: list[GpuSpec] = []
        self._extra: list[GpuSpec] = []
        lay = QtWidgets.QVBoxLayout(self)
        lay.setSpacing(3)
        self.list = QtWidgets.QListWidget()
        self.list.setMaximumHeight(90)
        lay.addWidget(self.list)

        add = QtWidgets.QHBoxLayout()
        self.card = QtWidgets.QComboBox()
        # no card is chosen until the user picks one: the first entry only says what the box is for
        self.card.addItem(ADD_CARD_PLACEHOLDER, None)
        for g in GPU_CATALOGUE.values():
            self.card.addItem(g.name, g.name)
        self.card.setToolTip("a card of the catalogue to plan beside the Hardware panel's choice")
        self.add_card_button = QtWidgets.QPushButton("Add card")
        self.add_card_button.setToolTip("add the chosen card as a what-if local GPU (like a repeated --gpu NAME)")
        self.add_card_button.setEnabled(False)
        self.card.currentIndexChanged.connect(
            lambda *_: self.add_card_button.setEnabled(self.card.currentData() is not None)
        )
        add.addWidget(self.card, 1)
        add.addWidget(self.add_card_button)
        lay.addLayout(add)

        rpc = QtWidgets.QHBoxLayout()
        self.rpc_edit = QtWidgets.QLineEdit()
        self.rpc_edit.setPlaceholderText("host:port  or  host:port=24G  or  host:port=RTX 3090")
        self.rpc_edit.setToolTip(
            "an rpc-server: host:port is asked for its devices' memory over llama.cpp's RPC "
            "protocol; =SIZE or =CARD plans a what-if. Never expose rpc-server on an open "
            "network (llama.cpp tools/rpc/README.md)."
        )
        self.add_rpc_button = QtWidgets.QPushButton("Add RPC host")
        rpc.addWidget(self.rpc_edit, 1)
        rpc.addWidget(self.add_rpc_button)
        lay.addLayout(rpc)
        self.remove_button = QtWidgets.QPushButton("Remove selected")
        lay.addWidget(self.remove_button)

        form = QtWidgets.QFormLayout()
        self.mode = QtWidgets.QComboBox()
        for m in ("layer", "row", "none"):
            self.mode.addItem(m, m)
        self.mode.setToolTip(
            "-sm: layer (default) splits whole layers and their KV; none uses only -mg; row is planned like layer"
        )
        form.addRow("Split mode (-sm)", self.mode)
        self.main_gpu = QtWidgets.QSpinBox()
        self.main_gpu.setRange(0, 15)
        self.main_gpu.setValue(1)  # a QSpinBox shows no text until its value first changes
        self.main_gpu.setValue(0)
        self.main_gpu.setToolTip("-mg: the one device with -sm none (index in the list above)")
        form.addRow("Main device (-mg)", self.main_gpu)
        self.by_memory = QtWidgets.QCheckBox("split by free memory (no -ts)")
        self.by_memory.setChecked(True)
        form.addRow(self.by_memory)
        lay.addLayout(form)
        self._split_form = form  # shown with two devices or more, like the list with one or more
        self.sliders_box = QtWidgets.QWidget()
        self.sliders_layout = QtWidgets.QFormLayout(self.sliders_box)
        self.sliders_layout.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.sliders_box)
        self.sliders: list[QtWidgets.QSlider] = []
        self._slider_devices: list[str] = []
        self.error = QtWidgets.QLabel()
        self.error.setStyleSheet("color: #b00020;")
        self.error.setWordWrap(True)
        self.error.hide()
        lay.addWidget(self.error)

        self.add_card_button.clicked.connect(self._add_card)
        self.add_rpc_button.clicked.connect(self._add_rpc)
        self.rpc_edit.returnPressed.connect(self._add_rpc)
        self.remove_button.clicked.connect(self._remove)
        self.mode.currentIndexChanged.connect(self._emit)
        self.main_gpu.valueChanged.connect(self._emit)
        self.by_memory.toggled.connect(self._on_by_memory)
        self._refresh()

    # -- the answer ------------------------------------------------------------------------------

    def set_base(self, gpus: list[GpuSpec]) -> None:
        """The Hardware panel's GPUs (detected or one what-if card); rebuilds the list if they changed."""
        gpus = list(gpus)
        if [(g.device, g.name) for g in gpus] != [(g.device, g.name) for g in self._base]:
            self._base = gpus
            self._refresh()

    def devices(self) -> list[GpuSpec]:
        """Every device, in llama.cpp's order (RPC first, then local GPUs, extra cards after the base)."""
        local = list(self._base)
        for g in self._extra:
            if g.endpoint is None:
                # the next slot, the card's own backend and figures kept (an AMD card stays ROCm)
                local.append(replace(g, index=len(local)))
        return order_devices([g for g in self._extra if g.endpoint is not None] + local)

    def split(self) -> DeviceSplit:
        """The split shown (``-ts`` from the sliders unless "by free memory" is checked).

        Raises:
            ConfigError: every slider at 0.
        """
        ts = None if self.by_memory.isChecked() else tuple(float(s.value()) for s in self.sliders)
        return DeviceSplit(split_mode=self.mode.currentData(), tensor_split=ts, main_gpu=self.main_gpu.value())

    def show_error(self, text: str | None) -> None:
        """One line under the panel (None hides it)."""
        self.error.setVisible(bool(text))
        self.error.setText(text or "")

    # -- editing ---------------------------------------------------------------------------------

    def add_device(self, spec: GpuSpec) -> None:
        """Add an extra device (a what-if card, or an RPC device)."""
        self._extra.append(spec)
        self._refresh()
        self._emit()

    def add_rpc(self, text: str) -> bool:
        """Add ``host:port`` (asked over the RPC protocol) or ``host:port=SIZE|CARD``; False (and
        the reason shown) when it cannot be used."""
        ep, eq, cap = text.strip().partition("=")
        try:
            if any(g.endpoint == ep.strip() for g in self._extra):
                raise RpcError(f"--rpc {ep.strip()} is already in the list")
            specs = [what_if_rpc_device(ep, cap.strip())] if eq else rpc_devices(query_endpoint(ep, timeout_s=2.0))
        except RpcError as exc:
            self.show_error(str(exc))
            return False
        self.show_error(None)
        self._extra += specs
        self._refresh()
        self._emit()
        return True

    def _add_card(self) -> None:
        name = self.card.currentData()
        if name is None:
            return
        self.add_device(catalogue_gpu(str(name)))
        self.card.setCurrentIndex(0)  # back to the placeholder: the next card is another choice

    def _add_rpc(self) -> None:
        if self.add_rpc(self.rpc_edit.text()):
            self.rpc_edit.clear()

    def _remove(self) -> None:
        row = self.list.currentRow()
        devs = self.devices()
        if 0 <= row < len(devs):
            target = devs[row]
            base_names = {g.device for g in self._base}
            if target.endpoint is None and target.device in base_names:
                self.show_error("that device is the Hardware panel's choice: change it there")
                return
            # extra local cards are renumbered in devices(): find the n-th extra local card
            if target.endpoint is not None:
                self._extra = [g for g in self._extra if g.endpoint != target.endpoint or g.index != target.index]
            else:
                k = target.index - len(self._base)
                locals_ = [g for g in self._extra if g.endpoint is None]
                drop = locals_[k]
                self._extra = [g for g in self._extra if g is not drop]
            self._refresh()
            self._emit()

    def _on_by_memory(self, checked: bool) -> None:
        for s in self.sliders:
            s.setEnabled(not checked)
        self._emit()

    def _refresh(self) -> None:
        devs = self.devices()
        self.list.clear()
        for i, g in enumerate(devs):
            kind = "RPC" if g.endpoint else "GPU"
            self.list.addItem(f"{i}: {g.backend_device}  {kind}  {g.name}, {fmt_bytes(g.total_bytes)}")
        # a device keeps its share when others are added (an RPC host goes first: indices move)
        old = {d: s.value() for d, s in zip(self._slider_devices, self.sliders)}
        self._slider_devices = [g.device for g in devs]
        while self.sliders_layout.rowCount():
            self.sliders_layout.removeRow(0)
        self.sliders = []
        for i, g in enumerate(devs):
            s = QtWidgets.QSlider(QtCore.Qt.Orientation.Horizontal)
            s.setRange(0, SLIDER_MAX)
            s.setValue(old.get(g.device, SLIDER_MAX // 2))
            s.setEnabled(not self.by_memory.isChecked())
            s.setToolTip(f"-ts share of device {i} ({g.backend_device})")
            s.valueChanged.connect(self._emit)
            self.sliders.append(s)
            self.sliders_layout.addRow(f"-ts {i}", s)
        self.main_gpu.setMaximum(max(0, len(devs) - 1))
        # one card or none: nothing to split, so the window shows only the two ways to add one
        self.list.setVisible(bool(devs))
        self.remove_button.setVisible(bool(self._extra))
        for row in range(self._split_form.rowCount()):
            self._split_form.setRowVisible(row, len(devs) >= 2)
        self.sliders_box.setVisible(len(devs) >= 2)

    def _emit(self, *_: object) -> None:
        try:
            self.split()
            self.show_error(None)
        except ConfigError as exc:
            self.show_error(str(exc))
            return
        self.changed.emit()
