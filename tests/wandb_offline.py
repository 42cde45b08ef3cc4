"""Read an offline W&B run file (`run-*.wandb`) back from disk, for tests.

The file is a LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1, version), then 32 KiB
blocks of records, each with a 7-byte header (crc32c: 4, length: 2, type: 1; FULL=1, FIRST=2,
MIDDLE=3, LAST=4) followed by a piece of a serialized `wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct

BLOCK = 32 * 1024


def records(path):
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left  # zero padding to the end of the block
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            pending = b""
            yield rec


def read_run(path) -> dict:
    """{'history': [row dicts], 'config': {key: value}, 'run': Record.run, 'metrics': {name: step
    metric ('' for none)} from `define_metric`} of one offline run."""
    out = {"history": [], "config": {}, "run": None, "metrics": {}}
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            out["history"].append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in rec.history.item
                }
            )
        elif kind == "config":
            for item in rec.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "run":
            out["run"] = rec.run
            for item in rec.run.config.update:  # the config given to wandb.init
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "metric" and rec.metric.name:
            out["metrics"][rec.metric.name] = rec.metric.step_metric
    return out


def wait_complete(path, timeout: float = 60.0) -> None:
    """Wait until the run file holds its exit record: wandb 0.31's `finish()` can return while
    wandb-core is still writing an offline run (seen: a 7-byte file right after train() returned)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            if any(rec.WhichOneof("record_type") == "exit" for rec in records(path)):
                return
        except Exception:  # noqa: BLE001 - a record still being written: read again
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path}: no exit record after {timeout:.0f} s")
        time.sleep(0.1)
