"""Byte-level safetensors surgery for the error-path tests (header = u64 LE length + JSON, then data)."""
from __future__ import annotations

import json
import struct
from pathlib import Path


def read_raw(path) -> tuple[dict, bytes]:
    b = Path(path).read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def write_raw(path, header: dict, data: bytes) -> None:
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + data)
