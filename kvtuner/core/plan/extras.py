"""What llama-server loads besides the main model: a vision/audio projector (``--mmproj``), a
draft model for speculative decoding (``-md``) and LoRA adapters (``--lora``), per device.

:func:`plan_extras` takes the main model's :class:`~kvtuner.core.plan.memory_plan.MemoryPlan`
and returns one :class:`ExtraSegment` per part, kind and device:

- draft model (common/speculative.cpp ``common_base_params_to_speculative``): the draft gets the
  main context's parameters (``n_ctx``, ``n_seq_max``, ``kv_unified``, ``n_ubatch``, flash
  attention; b11434 has no ``-cd``: "the draft context is created from the same base params and
  follows the main context", common/common.cpp ``common_init_result``), its own ``-ngld``
  (``params.speculative.draft.n_gpu_layers``), its own KV types ``-ctkd``/``-ctvd`` (default
  f16) and no tensor overrides unless ``-otd``. Its weights, KV, compute and output buffers are
  therefore the planner's own rules applied to the draft file
  (:func:`~kvtuner.core.plan.memory_plan.plan_memory` with those settings); llama-server's
  ``--fit`` prints them as a second memory-breakdown table ("getting device memory data for the
  extra model", common/fit.cpp ``common_params_fit_impl``).
- projector (tools/mtmd/clip.cpp ``clip_model_loader::load_tensors``): every tensor of the
  mmproj file in one buffer on the first GPU backend, or the CPU with ``--no-mmproj-offload``
  (``mtmd_context_params.use_gpu``), and its compute buffer for one image
  (:func:`projector_compute_bytes`).
- LoRA (src/llama-adapter.cpp ``llama_adapter_lora_init_impl``): each ``*.lora_a``/``*.lora_b``
  tensor is allocated in the buffer type of the base tensor it adapts, so on the device of that
  tensor's layer (``token_embd`` on the host, ``output`` where the output layer is).

Errors (one line, what to change) follow llama-server's refusals: a file that is not GGUF, a
projector whose output width is not the model's ``n_embd`` (tools/mtmd/mtmd.cpp "mismatch
between text model ... and mmproj"), a draft whose vocabulary differs by more than 128 tokens
(common/speculative.cpp ``SPEC_VOCAB_MAX_SIZE_DIFFERENCE``), a file that is not a LoRA adapter
(llama-adapter.cpp "expect general.type to be 'adapter'").
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..model.gguf_header import GGUFError, GGUFHeader, read_header
from .buffers import HOST
from .config import ALL_LAYERS, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from ..hardware.specs import GpuSpec, HostSpec
    from ..model.profile import ModelProfile
    from .memory_plan import MemoryPlan

#: common/speculative.cpp ``SPEC_VOCAB_MAX_SIZE_DIFFERENCE``: the most tokens a draft's
#: vocabulary may differ from the main model's.
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
#: The projector output-width keys clip.cpp reads (``clip.vision.projection_dim`` /
#: ``clip.audio.projection_dim``, tools/mtmd/clip-impl.h ``KEY_PROJ_DIM``).
_PROJ_DIM_KEYS = ("clip.vision.projection_dim", "clip.audio.projection_dim")
_BLK_RE = re.compile(r"^blk\.(\d+)\.")
MiB = 1 << 20


@dataclass(frozen=True)
class ExtrasConfig:
    """The extra files of a llama-server command line and their settings.

    Attributes:
        mmproj: the projector GGUF (``--mmproj``/``-mm``), None for none.
        mmproj_offload: the projector on the GPU (False: ``--no-mmproj-offload``).
        draft: the draft model GGUF (``-md``/``--spec-draft-model``), None for none.
        draft_gpu_layers: ``-ngld`` (``--spec-draft-ngl``): layers of the draft on the GPU, or
            :data:`~kvtuner.core.plan.config.ALL_LAYERS`.
        draft_type_k, draft_type_v: the draft's KV types (``-ctkd``/``-ctvd``, default f16).
        loras: LoRA adapter GGUFs (``--lora``, repeatable), with a scale each.
        draft_tensor_overrides: the draft's ``-otd PATTERN=BUFFER`` overrides.
        draft_cpu_moe: the draft's MoE experts in host RAM (``-cmoed``).
        draft_n_max: tokens drafted per step (``--spec-draft-n-max``, older ``--draft-max``;
            default 3, common/common.h); used by the speed range only.
        draft_ctx: the draft's own context (``-cd``, builds before the ``--spec-*`` renames);
            None: the main context (b11434).
    """

    mmproj: str | None = None
    mmproj_offload: bool = True
    draft: str | None = None
    draft_gpu_layers: int = ALL_LAYERS
    draft_type_k: str = "f16"
    draft_type_v: str = "f16"
    loras: tuple[tuple[str, float], ...] = ()
    draft_tensor_overrides: tuple[str, ...] = ()
    draft_cpu_moe: bool = False
    draft_n_max: int = 3
    draft_ctx: int | None = None

    @property
    def empty(self) -> bool:
        """No extra file at all."""
        return self.mmproj is None and self.draft is None and not self.loras

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (docs/reference/plan-json.md, ``extras.config``)."""
        return {
            "mmproj": self.mmproj,
            "mmproj_offload": self.mmproj_offload,
            "draft": self.draft,
            "draft_gpu_layers": "all" if self.draft_gpu_layers == ALL_LAYERS else self.draft_gpu_layers,
            "draft_type_k": self.draft_type_k,
            "draft_type_v": self.draft_type_v,
            "loras": [{"path": p, "scale": s} for p, s in self.loras],
            "draft_tensor_overrides": list(self.draft_tensor_overrides),
            "draft_cpu_moe": self.draft_cpu_moe,
            "draft_n_max": self.draft_n_max,
            "draft_ctx": self.draft_ctx,
        }


@dataclass(frozen=True)
class ExtraSegment:
    """One part's bytes of one kind on one device.

    Attributes:
        part: ``mmproj``, ``draft`` or ``lora``.
        kind: ``weights``, ``kv``, ``compute`` or ``output``.
        device: ``CPU`` (host) or ``CUDA0`` ...
        bytes: the bytes.
        source: how it was obtained (``gguf tensor table``, ``kvtuner plan of the draft``,
            ``llama-server fit table``).
    """

    part: str
    kind: str
    device: str
    bytes: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {"part": self.part, "kind": self.kind, "device": self.device, "bytes": self.bytes, "source": self.source}


@dataclass(frozen=True)
class ExtrasPlan:
    """The extras of one plan.

    Attributes:
        config: what was planned.
        segments: per part, kind and device.
        draft_plan: the draft's own memory plan (None without ``-md``).
        image_tokens: context tokens one image takes (None without a vision projector).
        notes: what is not counted and why.
    """

    config: ExtrasConfig
    segments: tuple[ExtraSegment, ...] = ()
    draft_plan: MemoryPlan | None = None
    image_tokens: int | None = None
    notes: tuple[str, ...] = field(default=())

    def bytes_by_device(self) -> dict[str, int]:
        """Total extra bytes per device."""
        out: dict[str, int] = {}
        for s in self.segments:
            out[s.device] = out.get(s.device, 0) + s.bytes
        return out

    def part_bytes(self, part: str, kind: str | None = None, device: str | None = None) -> int:
        """Bytes of one part (optionally one kind, one device)."""
        return sum(
            s.bytes
            for s in self.segments
            if s.part == part and (kind is None or s.kind == kind) and (device is None or s.device == device)
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``extras`` key of ``kvtuner plan --json`` (docs/reference/plan-json.md)."""
        return {
            "config": self.config.to_dict(),
            "segments": [s.to_dict() for s in self.segments],
            "bytes_by_device": self.bytes_by_device(),
            "image_tokens": self.image_tokens,
            "draft": None
            if self.draft_plan is None
            else {
                "n_gpu_layers": self.draft_plan.n_gpu_layers,
                "n_ctx": self.draft_plan.n_ctx,
                "devices": [d.to_dict() for d in self.draft_plan.devices],
                "kv_caches": self.draft_plan.to_dict()["kv_caches"],
                "compute_source": self.draft_plan.compute.source,
            },
            "notes": list(self.notes),
        }


#: Headers and profiles read, by (path, size, mtime): the advisor and the tuner re-plan the extras
#: for every candidate configuration.
_CACHE: dict[tuple, Any] = {}
_CACHE_MAX = 32


def _cached(p: Path, kind: str, read: Any) -> Any:
    st = p.stat()
    key = (kind, str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[key] = read(p)
    return _CACHE[key]


def _header(path: str, what: str, flag: str) -> GGUFHeader:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"{flag} {path}: no such file: give the path of the {what} GGUF")
    try:
        return _cached(p, "header", read_header)
    except GGUFError as exc:
        raise ConfigError(f"{flag} {path}: not a readable GGUF file ({exc}): give the {what} GGUF") from None


def _tensor_bytes(h: GGUFHeader) -> int:
    return sum(t.n_bytes for t in h.tensors)


def projector_header(path: str, n_embd: int) -> GGUFHeader:
    """Read and check a projector file.

    Raises:
        ConfigError: not GGUF, not a clip projector (``general.architecture`` != ``clip``), or a
            projection width that is not the text model's ``n_embd``.
    """
    h = _header(path, "projector (mmproj)", "--mmproj")
    arch = h.metadata.get("general.architecture")
    if arch != "clip":
        raise ConfigError(
            f"--mmproj {path}: general.architecture is {arch!r}, not 'clip': give the model's mmproj GGUF"
        )
    for key in _PROJ_DIM_KEYS:
        dim = h.metadata.get(key)
        if isinstance(dim, int) and dim != n_embd:
            raise ConfigError(
                f"--mmproj {path}: the projector outputs {dim}-wide embeddings ({key}) and the model's "
                f"are {n_embd} wide: give the mmproj made for this model"
            )
    return h


def image_tokens(h: GGUFHeader) -> int | None:
    """Context tokens of one image at the projector's native size: ``(image_size / patch_size)^2``
    patches, divided by the merge factor (``clip.vision.projector.scale_factor``, Gemma 3's 4x4
    average pool: ``clip.cpp`` ``clip_n_output_tokens`` ``PROJECTOR_TYPE_GEMMA3``: 256 of 4096);
    None without vision hparams."""
    md = h.metadata
    size, patch = md.get("clip.vision.image_size"), md.get("clip.vision.patch_size")
    if not isinstance(size, int) or not isinstance(patch, int) or patch <= 0:
        return None
    n = (size // patch) ** 2
    scale = md.get("clip.vision.projector.scale_factor")
    if isinstance(scale, int) and scale > 1:
        n //= scale * scale
    elif md.get("clip.projector_type") == "gemma3":
        n //= 16  # clip.cpp: n_merge 4 (AvgPool2d 4x4) when the file states no scale factor
    return n


def projector_compute_bytes(h: GGUFHeader) -> int:
    """The projector's compute buffer for one image at its native size, bytes (0 when the file
    has no ``clip.vision.*`` sizes).

    clip.cpp reserves the graph of a warm-up image (``reserve_compute_meta`` after
    ``get_dummy_batch``: ``image_size`` square, ``n_pos = (image_size / patch_size)^2`` patches)
    with flash attention when the backend supports it (``warmup: flash attention is enabled``),
    so no ``n_pos^2`` score matrix. ggml-alloc reuses memory between blocks; the peak is a
    block's feed-forward: the ``n_pos x n_ff`` f32 up-projection while the residual stream, the
    attention output it was added to and the normed input (three ``n_pos x n_embd`` f32) are
    alive: ``4 x n_pos x (n_ff + 3 n_embd)`` bytes (SigLIP-So400m at 896 px: 121.25 MiB, as
    llama-server b11434 logs it on the CPU).
    """
    md = h.metadata
    size, patch = md.get("clip.vision.image_size"), md.get("clip.vision.patch_size")
    n_embd, n_ff = md.get("clip.vision.embedding_length"), md.get("clip.vision.feed_forward_length")
    if not (
        isinstance(size, int)
        and isinstance(patch, int)
        and isinstance(n_embd, int)
        and isinstance(n_ff, int)
        and min(size, patch, n_embd, n_ff) > 0
    ):
        return 0
    n_pos = (size // patch) ** 2
    return 4 * n_pos * (n_ff + 3 * n_embd)


def projector_flops(h: GGUFHeader) -> int:
    """Floating-point operations of encoding one image at the native size: ``2 x n_pos`` per
    weight of the ViT's matrices (``v.blk.*`` 2-D weights and the projection) plus attention's
    ``4 x n_pos^2 x n_embd`` per block; 0 without ``clip.vision.*`` sizes."""
    md = h.metadata
    size, patch = md.get("clip.vision.image_size"), md.get("clip.vision.patch_size")
    n_embd, n_block = md.get("clip.vision.embedding_length"), md.get("clip.vision.block_count")
    if not (
        isinstance(size, int)
        and isinstance(patch, int)
        and isinstance(n_embd, int)
        and isinstance(n_block, int)
        and min(size, patch, n_embd, n_block) > 0
    ):
        return 0
    n_pos = (size // patch) ** 2
    weights = sum(
        t.n_elements
        for t in h.tensors
        if len(t.shape) >= 2 and t.name.endswith(".weight") and "position_embd" not in t.name
    )
    return 2 * n_pos * weights + 4 * n_pos * n_pos * n_embd * n_block


def lora_header(path: str) -> GGUFHeader:
    """Read and check a LoRA adapter (src/llama-adapter.cpp ``llama_adapter_lora_init_impl``).

    Raises:
        ConfigError: not GGUF, ``general.type`` not ``adapter`` or ``adapter.type`` not ``lora``,
            or no ``.lora_a``/``.lora_b`` tensor.
    """
    h = _header(path, "LoRA adapter", "--lora")
    md = h.metadata
    if md.get("general.type") != "adapter" or md.get("adapter.type") != "lora":
        raise ConfigError(
            f"--lora {path}: not a LoRA adapter (general.type {md.get('general.type')!r}, adapter.type "
            f"{md.get('adapter.type')!r}): convert it with convert_lora_to_gguf.py"
        )
    if not any(t.name.endswith((".lora_a", ".lora_b")) for t in h.tensors):
        raise ConfigError(f"--lora {path}: no .lora_a/.lora_b tensors: convert it with convert_lora_to_gguf.py")
    return h


def draft_profile(path: str, main: ModelProfile) -> ModelProfile:
    """Read and check a draft model against the main one.

    Raises:
        ConfigError: not GGUF, not a language model, or a vocabulary more than
            :data:`SPEC_VOCAB_MAX_SIZE_DIFFERENCE` tokens from the main model's.
    """
    from ..model.profile import ModelProfile

    _header(path, "draft model", "-md")
    try:
        draft = _cached(Path(path).expanduser(), "profile", ModelProfile.from_gguf)
    except GGUFError as exc:
        raise ConfigError(f"-md {path}: {exc}: give a draft model GGUF") from None
    if abs(draft.n_vocab - main.n_vocab) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        raise ConfigError(
            f"-md {path}: its vocabulary has {draft.n_vocab} tokens and the model's {main.n_vocab} "
            f"(llama.cpp allows {SPEC_VOCAB_MAX_SIZE_DIFFERENCE} apart): give a draft of the same model family"
        )
    return draft


def check_files(extras: ExtrasConfig, model: ModelProfile) -> None:
    """Check every extra file of ``extras`` against ``model`` as llama-server would.

    Raises:
        ConfigError: the first bad file (one line, what to change).
    """
    if extras.mmproj:
        projector_header(extras.mmproj, model.n_embd)
    if extras.draft:
        draft_profile(extras.draft, model)
    for path, _scale in extras.loras:
        lora_header(path)


def _lora_device(name: str, plan: MemoryPlan) -> str:
    """The device of the base tensor a LoRA tensor adapts."""
    m = _BLK_RE.match(name)
    devs = plan.layer_devices
    if m and devs:
        il = int(m.group(1))
        return devs[il] if il < len(devs) - 1 else HOST
    if name.startswith("output.") and devs:
        return devs[-1]
    return HOST


def plan_extras(
    plan: MemoryPlan,
    extras: ExtrasConfig,
    gpus: Sequence[GpuSpec] = (),
    host: HostSpec | None = None,
    *,
    split: Any = None,
    draft_exact: Any = None,
) -> ExtrasPlan:
    """Plan ``extras`` next to the main ``plan`` (same devices).

    Args:
        plan: the main model's plan.
        extras: the extra files and settings.
        gpus, host, split: the hardware the main plan was made for.
        draft_exact: llama-server's figures for the draft
            (:class:`~kvtuner.core.plan.memory_plan.ExactFigures`), None for kvtuner's own.

    Raises:
        ConfigError: a file llama-server would refuse (one line).
    """
    from .memory_plan import plan_memory

    segs: list[ExtraSegment] = []
    notes: list[str] = []
    draft_plan = None
    n_img = None
    # clip.cpp takes the first GPU backend (ggml_backend_init_by_type GGML_BACKEND_DEVICE_TYPE_GPU)
    gpu_devices = [d.device for d in plan.gpus if d.kind == "gpu"]
    if extras.mmproj:
        h = projector_header(extras.mmproj, plan.model.n_embd)
        dev = gpu_devices[0] if (extras.mmproj_offload and gpu_devices) else HOST
        segs.append(ExtraSegment("mmproj", "weights", dev, _tensor_bytes(h), "gguf tensor table"))
        n_img = image_tokens(h)
        compute = projector_compute_bytes(h)
        if compute:
            segs.append(
                ExtraSegment(
                    "mmproj", "compute", dev, compute, "estimate: ViT feed-forward peak at the native image size"
                )
            )
        else:
            notes.append(
                "projector compute buffer not estimated (no clip.vision.* sizes): llama-server's log line "
                "'reserve_compute_meta: ... compute buffer size' gives it"
            )
    if extras.draft:
        draft = draft_profile(extras.draft, plan.model)
        cfg = plan.config.with_(
            n_gpu_layers=extras.draft_gpu_layers,
            kv_gpu_layers=None,
            type_k=extras.draft_type_k,
            type_v=extras.draft_type_v,
            n_cpu_moe=0,
            cpu_moe=extras.draft_cpu_moe,
            n_cpu_ffn=0,
            tensor_overrides=extras.draft_tensor_overrides,
        )
        if extras.draft_ctx is not None:
            # an older build's -cd; llama.cpp b11434 has no -cd and sizes the draft by -c
            cfg = cfg.with_(n_ctx=extras.draft_ctx)
            notes.append(
                f"-cd {extras.draft_ctx}: the draft's context as builds before the --spec-* renames take it; "
                "llama.cpp b11434 has no -cd (the draft follows -c)"
            )
        # the draft runs in the same program as the model (llama-server's draft context: one output
        # per slot when the plan follows llama-server, kvtuner.core.plan.build_rules)
        kw: dict[str, Any] = {"split": split, "rules": plan.rules}
        if draft_exact is not None:
            kw["exact"] = draft_exact
        draft_plan = plan_memory(draft, cfg, gpus, host, **kw)
        src = "llama-server fit table" if draft_exact is not None else "kvtuner plan of the draft"
        if draft_exact is None:
            notes.append(
                "the draft's compute buffer is kvtuner's estimate: plan --verify --engine server reads "
                "llama-server's own (its fit step's table for the draft)"
            )
        for d in draft_plan.devices:
            for kind, b in (
                ("weights", d.weights_bytes + d.repack_bytes),
                ("kv", d.kv_bytes),
                ("compute", d.compute_bytes),
                ("output", d.output_bytes),
            ):
                if b:
                    segs.append(ExtraSegment("draft", kind, d.device, b, src))
    for path, _scale in extras.loras:
        h = lora_header(path)
        per: dict[str, int] = {}
        for t in h.tensors:
            dev = _lora_device(t.name, plan)
            per[dev] = per.get(dev, 0) + t.n_bytes
        for dev, b in per.items():
            segs.append(ExtraSegment("lora", "weights", dev, b, f"gguf tensor table ({os.path.basename(path)})"))
    return ExtrasPlan(extras, tuple(segs), draft_plan, n_img, tuple(notes))


def server_flags(extras: ExtrasConfig, known_flags: frozenset[str] | set[str] | None = None) -> list[str]:
    """The llama-server flags of ``extras``, spelled as the target build knows them.

    ``known_flags``: the flags the build's ``--help`` lists (None: llama.cpp b11434's): ``-cd`` is
    written only for a build that lists it, ``--draft-max`` for one without ``--spec-draft-n-max``. The short
    spellings ``--mmproj``, ``-md``, ``-ngld``, ``-ctkd``, ``-ctvd``, ``--lora`` are taken by
    b11434 and by the builds before the ``--spec-*`` renames; a build without ``-md`` but with
    ``--spec-draft-model`` gets the long one. A scaled LoRA is ``--lora-scaled FILE:SCALE``
    (b11434's form, common/arg.cpp).
    """

    def spell(short: str, long: str) -> str:
        if known_flags and short not in known_flags and long in known_flags:
            return long
        return short

    argv: list[str] = []
    if extras.mmproj:
        argv += ["--mmproj", os.fspath(extras.mmproj)]
        if not extras.mmproj_offload:
            argv.append("--no-mmproj-offload")
    if extras.draft:
        ngld = "all" if extras.draft_gpu_layers == ALL_LAYERS else str(extras.draft_gpu_layers)
        argv += [spell("-md", "--spec-draft-model"), os.fspath(extras.draft), spell("-ngld", "--spec-draft-ngl"), ngld]
        if extras.draft_type_k != "f16":
            argv += [spell("-ctkd", "--spec-draft-type-k"), extras.draft_type_k]
        if extras.draft_type_v != "f16":
            argv += [spell("-ctvd", "--spec-draft-type-v"), extras.draft_type_v]
        for ot in extras.draft_tensor_overrides:
            argv += [spell("-otd", "--spec-draft-override-tensor"), ot]
        if extras.draft_cpu_moe:
            argv.append(spell("-cmoed", "--spec-draft-cpu-moe"))
        if extras.draft_n_max != 3:
            # b11434 removed --draft-max (common/arg.cpp arg_removed); older builds know only it
            old = known_flags is not None and "--spec-draft-n-max" not in known_flags and "--draft-max" in known_flags
            argv += ["--draft-max" if old else "--spec-draft-n-max", str(extras.draft_n_max)]
        if extras.draft_ctx is not None and (not known_flags or "-cd" in known_flags):
            argv += ["-cd", str(extras.draft_ctx)]
    for path, scale in extras.loras:
        argv += ["--lora", path] if scale == 1.0 else ["--lora-scaled", f"{path}:{scale:g}"]
    return argv


def with_extras(plan: MemoryPlan, xp: ExtrasPlan | None) -> MemoryPlan:
    """``plan`` with ``xp``'s bytes in each device's ``extras_bytes`` (so its totals, the fit
    verdict and the advisor count them) and ``xp`` as its ``extras``; ``plan`` itself when
    ``xp`` is None or empty."""
    from dataclasses import replace

    if xp is None or xp.config.empty:
        return plan
    per = xp.bytes_by_device()
    devices = tuple(replace(d, extras_bytes=per.get(d.device, 0)) for d in plan.devices)
    return replace(plan, devices=devices, extras=xp)


def replan_extras(
    plan: MemoryPlan, like: MemoryPlan, gpus: Sequence[GpuSpec] = (), host: HostSpec | None = None
) -> MemoryPlan:
    """``plan`` (a re-plan of another configuration) with the extras of ``like`` planned again
    for it (the draft follows the new context; LoRA tensors their layers' new devices); ``plan``
    itself when ``like`` has none or they no longer plan."""
    xp = getattr(like, "extras", None)
    if xp is None:
        return plan
    try:
        return with_extras(plan, plan_extras(plan, xp.config, gpus, host, split=plan.split))
    except ConfigError:
        return plan
