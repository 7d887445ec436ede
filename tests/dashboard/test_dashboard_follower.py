"""The byte-offset JSONL follower: torn lines, garbage, replacement, overlong lines."""

from __future__ import annotations

import os

from dashboard.log_follower import MAX_LINE, LogFollower, parse_lines


def entry(step: int) -> bytes:
    return b'{"type": "step", "step": %d, "loss": 1.5}\n' % step


def test_parse_lines_keeps_offsets_and_skips_garbage():
    data = entry(1) + b"garbage\n" + b"[1, 2]\n" + b"42\n" + b"\n" + b'{"a": NaN}\n' + entry(2) + b'{"type": "st'
    out, used = parse_lines(data, base=100)
    assert [o["step"] for _, _, o in out] == [1, 2]
    assert used == len(data) - len(b'{"type": "st')
    s, e, _ = out[1]
    assert data[s - 100 : e - 100] == entry(2)


def test_torn_last_line_waits_for_its_newline(tmp_path):
    log = tmp_path / ".loss.json"
    log.write_bytes(entry(1) + b'{"type": "step", "st')
    f = LogFollower(tmp_path)
    c = f.poll()
    assert [o["step"] for _, _, o in c.entries] == [1]
    assert f.offset == len(entry(1))
    assert f.poll().entries == []  # nothing new is complete
    with open(log, "ab") as fh:
        fh.write(b'ep": 2, "loss": 1.0}\n')
    c = f.poll()
    assert [o["step"] for _, _, o in c.entries] == [2]
    assert f.offset == log.stat().st_size


def test_torn_fragment_never_glues_onto_the_next_entry(tmp_path):
    # a crash left a fragment; the next writer starts on a fresh line (docs/FORMATS.md)
    log = tmp_path / ".loss.json"
    log.write_bytes(entry(1) + b'{"type": "step", "step": 2, "lo' + b"\n" + entry(2) + entry(3))
    c = LogFollower(tmp_path).poll()
    assert [o["step"] for _, _, o in c.entries] == [1, 2, 3]


def test_replaced_or_truncated_file_restarts_from_zero(tmp_path):
    log = tmp_path / ".loss.json"
    log.write_bytes(entry(1) + entry(2))
    f = LogFollower(tmp_path)
    assert len(f.poll().entries) == 2
    tmp = tmp_path / "new"
    tmp.write_bytes(entry(7))
    os.replace(tmp, log)
    c = f.poll()
    assert c.reset and [o["step"] for _, _, o in c.entries] == [7]
    with open(log, "r+b") as fh:
        fh.truncate(0)
    c = f.poll()
    assert c.reset and c.entries == [] and f.offset == 0


def test_overlong_line_is_skipped_once_complete(tmp_path):
    log = tmp_path / ".loss.json"
    big = b'{"type": "step", "step": 5, "pad": "' + b"x" * (MAX_LINE + 10)
    log.write_bytes(entry(1) + big)
    f = LogFollower(tmp_path)
    assert len(f.poll().entries) == 1
    assert f.poll().entries == [] and f.offset == len(entry(1))  # still being written
    with open(log, "ab") as fh:
        fh.write(b'"}\n' + entry(2))
    steps = []
    for _ in range(5):
        steps += [o["step"] for _, _, o in f.poll().entries]
    assert steps == [2]


def test_missing_file_and_symlink_are_not_read(tmp_path):
    f = LogFollower(tmp_path)
    assert f.poll().entries == []
    outside = tmp_path.parent / (tmp_path.name + "-outside.json")
    outside.write_bytes(entry(1))
    (tmp_path / ".loss.json").symlink_to(outside)
    assert f.poll().entries == []
