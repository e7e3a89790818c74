"""The records of an offline W&B run file (``run-<id>.wandb``), read for the tests: W&B writes them in the
LevelDB log format (a 7-byte file header, 32 KiB blocks, each record chunk behind a 7-byte header: CRC32,
length, type), each record a ``wandb_internal_pb2.Record`` protobuf."""
import struct

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path):
    """The :class:`wandb_internal_pb2.Record` messages of the run file ``path``, in order."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", path
    pos, parts, out = HEADER, [], []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:
            break
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        parts.append(chunk)
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            out.append(record)
            parts = []
    return out


def history(path):
    """The rows ``run.log`` wrote to the run file ``path``: a list of ``{key: value}`` (JSON-decoded values)."""
    import json

    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows
