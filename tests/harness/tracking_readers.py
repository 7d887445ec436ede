"""Readers for what the tracker wrote, for the tests: TensorBoard's own (EventAccumulator, EventFileLoader) and
W&B's offline `.wandb` file read record by record with W&B's own protobuf classes.

The `.wandb` file is a LevelDB log (W&B has no Python reader for it in 0.31): a 7-byte header
(":W&B", 0xBEE1, version), then 32 KiB blocks of chunks, each a 7-byte header (CRC-32C, length
uint16, type: 1 full, 2 first, 3 middle, 4 last) and its bytes.
"""

from __future__ import annotations

import struct
from pathlib import Path

HEADER = 7
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _accumulator(directory: Path, purge: bool):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0}, purge_orphaned_data=purge)
    acc.Reload()
    return acc


def tensorboard_scalars(directory: Path, purge: bool = False) -> dict[str, list[tuple[int, float]]]:
    """Every scalar by tag as EventAccumulator reads it; with no purging (the default) a duplicate step stays
    visible, with it a pivot's SessionLog START drops the old phase's later points as TensorBoard shows them."""
    acc = _accumulator(directory, purge)
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tensorboard_texts(directory: Path, tag: str) -> list[tuple[int, str]]:
    acc = _accumulator(directory, False)
    if tag not in acc.Tags()["tensors"]:
        return []
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]


def wandb_records(path: Path) -> list:
    """The Record protos of one `.wandb` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1, f"{path}: not a .wandb file"
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            break  # zero padding: the end of what was written
        if kind in (FULL, FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_history_steps(records: list, key: str = "train/loss") -> list[int]:
    """The `train/step` of every history row that holds `key`."""
    steps = []
    for r in records:
        if r.WhichOneof("record_type") != "history":
            continue
        items = {(i.key or "/".join(i.nested_key)): i.value_json for i in r.history.item}
        if key in items:
            steps.append(int(float(items["train/step"])))
    return steps
