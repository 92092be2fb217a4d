"""The runner's JSON-lines protocol: round trips, versioning, garbage."""

from __future__ import annotations

import json

import pytest

from kvtuner.core import llama_report as R
from kvtuner.runner import protocol as P

EXAMPLES = [
    P.DryRunCommand(model_path="/m.gguf", config={"n_ctx": 8192}),
    P.LoadCommand(model_path="/m.gguf", config={"n_ctx": 512}, n_threads=2),
    P.BenchCommand(n_prompt=32, n_gen=8, n_depth=0, repetitions=1),
    P.CancelCommand(),
    P.ShutdownCommand(),
]
EVENTS = [
    P.StartedEvent(
        pid=1,
        protocol_version=1,
        llama_build="x",
        devices=("CPU",),
        device_descriptions=("cpu",),
        gpu_offload_supported=False,
    ),
    P.KvCacheEvent(cache=R.KvCacheReport(12.75, 8192, 3, 1, 1, "q8_0", 6.38, "q8_0", 6.38)),
    P.BufferEvent(buffer=R.BufferReport("compute", "CPU", 514.5)),
    P.DryRunResultEvent(
        result=R.DryRunResult(
            kv_caches=(R.KvCacheReport(12.75, 8192, 3, 1, 1, "q8_0", 6.38, "q8_0", 6.38),),
            compute_mib={"CPU": 514.5},
            output_mib={"CPU": 1.0},
            model_mib={"CPU_Mapped": 0.0},
            kv_buffer_mib={"CPU": 0.0},
            n_ctx=8192,
            n_ctx_seq=8192,
            flash_attn=True,
            gpu_offload_supported=False,
            devices=("CPU",),
            llama_build="x",
            log_tail=("a",),
            recurrent=(R.RecurrentStateReport(598.5, 4, 64, 4, 0, "f32", 30.0, "f32", 568.5),),
            structure_facts={"n_layer": 18, "kv": [[0, "CPU", ""]]},
            breakdown=(R.MemoryBreakdownRow("host", "Host", "", 222, 27, 23, 272),),
            offloaded=R.OffloadedLayers(19, 19),
            graph=R.GraphReport(730, 730, 1, 1),
        )
    ),
    P.TokenEvent(rep=0, index=3, token=17, dt_s=0.01, t_s=0.04),
    P.ErrorEvent(kind="crashed", message="boom", log_tail=("a", "b")),
    P.ContextEvent(
        n_ctx=8192, n_ctx_seq=8192, n_seq_max=1, n_batch=2048, n_ubatch=512, flash_attn=None, kv_unified=False
    ),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: m.type)
def test_command_round_trip(msg):
    line = P.encode(msg)
    assert "\n" not in line
    assert json.loads(line)["v"] == P.PROTOCOL_VERSION
    assert P.decode_command(line) == msg


@pytest.mark.parametrize("msg", EVENTS, ids=lambda m: m.type)
def test_event_round_trip(msg):
    assert P.decode_event(P.encode(msg)) == msg
    assert P.decode_event(P.encode(msg).encode()) == msg  # bytes too


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("this is not json", "not a JSON message"),
        ("[1, 2]", "not a JSON object"),
        ('{"v": 99, "type": "cancel"}', "protocol version 99"),
        ('{"type": "cancel"}', "protocol version None"),
        ('{"v": 1, "type": "launch_missiles"}', "unknown message type"),
        ('{"v": 1, "type": "load", "config": {}}', "lacks field 'model_path'"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_garbage_is_a_protocol_error(line, fragment):
    with pytest.raises(P.ProtocolError, match=fragment):
        P.decode_command(line)


@pytest.mark.parametrize(
    "line, fragment",
    [
        ('{"v": 1, "type": "kv_cache", "cache": {"size_mib": 1.0}}', "KvCacheReport lacks 'cells'"),
        ('{"v": 1, "type": "buffer", "buffer": [1, 2]}', "BufferReport must be an object"),
        ('{"v": 1, "type": "dry_run_result", "result": {"kv_caches": []}}', "a dry-run result lacks 'compute_mib'"),
    ],
)
def test_a_malformed_record_is_a_protocol_error(line, fragment):
    with pytest.raises(P.ProtocolError, match=fragment):
        P.decode_event(line)


def test_unknown_fields_are_ignored():
    assert P.decode_command('{"v": 1, "type": "cancel", "future_field": 3}') == P.CancelCommand()


def test_events_are_not_commands():
    with pytest.raises(P.ProtocolError):
        P.decode_command(P.encode(EVENTS[0]))


def test_error_kinds_listed():
    for kind in ("out_of_memory", "invalid_config", "crashed", "cancelled", "model_error", "timeout", "protocol_error"):
        assert kind in P.ERROR_KINDS


def test_parent_side_modules_never_import_llama_cpp():
    import subprocess
    import sys

    code = (
        "import sys, kvtuner.runner, kvtuner.runner.client, kvtuner.runner.dryrun, kvtuner.runner.bench, "
        "kvtuner.runner.protocol, kvtuner.runner.llama_log, kvtuner.core.plan.placement, kvtuner.core.monitor.sampler, kvtuner.cli; "
        "kvtuner.cli.build_parser(); "
        "assert 'llama_cpp' not in sys.modules, 'llama_cpp imported'; "
        "assert not any(m.startswith('PySide6') for m in sys.modules), 'Qt imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
