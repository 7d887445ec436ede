"""The wire constants written in both languages agree: the C headers are parsed and compared with the Python
definitions (frames, exit codes, the checkpoint trailer and footer, the token shard's header).

Nothing here runs the engine: a constant changed on one side only fails here, before any end-to-end test."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from proxy.formats import checkpoint, engine_cli, frames, shard

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "microgpt"

# C field types as struct codes (every header is little-endian with natural alignment and no padding: each
# struct has a static_assert on its size, and the Python side asserts its Struct's size).
C_TYPES = {
    "char": "s",
    "unsigned char": "s",
    "uint8_t": "B",
    "int8_t": "b",
    "uint16_t": "H",
    "int16_t": "h",
    "uint32_t": "I",
    "int32_t": "i",
    "uint64_t": "Q",
    "int64_t": "q",
    "float": "f",
    "double": "d",
}


def _header(name: str) -> str:
    text = (ENGINE / name).read_text(encoding="utf-8")
    return re.sub(r"//[^\n]*", "", text)  # comments name constants too


def c_enum(header: str, prefix: str) -> dict[str, int]:
    """Every `PREFIX_NAME = value` of the header's enums."""
    found = {}
    for body in re.findall(r"enum\s*\{([^}]*)\}", _header(header)):
        for name, value in re.findall(rf"\b({prefix}\w+)\s*=\s*(\d+)", body):
            found[name] = int(value)
    assert found, f"no {prefix}* enum in microgpt/{header}"
    return found


def c_define(header: str, name: str) -> str:
    m = re.search(rf"^#define\s+{name}\s+(.+?)\s*$", _header(header), re.MULTILINE)
    assert m, f"no #define {name} in microgpt/{header}"
    return m.group(1)


def c_struct(header: str, name: str) -> list[str]:
    """A `typedef struct { ... } name;` as struct codes, one per value (`9i` is nine `i`; a char array is `Ns`)."""
    m = re.search(rf"typedef\s+struct\s*\{{([^}}]*)\}}\s*{name}\s*;", _header(header))
    assert m, f"no struct {name} in microgpt/{header}"
    codes = []
    for decl in filter(None, (d.strip() for d in m.group(1).split(";"))):
        ctype = next((t for t in sorted(C_TYPES, key=len, reverse=True) if decl.startswith(t + " ")), None)
        assert ctype, f"{name}: a field of a type this test does not know: {decl!r}"
        for var in decl[len(ctype) :].split(","):
            arr = re.fullmatch(r"\s*\w+\s*(?:\[(\d+)\])?\s*", var)
            assert arr, f"{name}: cannot read field {var!r}"
            count = int(arr.group(1) or 1)
            codes += [f"{count}s"] if C_TYPES[ctype] == "s" else [C_TYPES[ctype]] * count
    return codes


def py_struct(fmt: str) -> list[str]:
    """A little-endian struct format as the same one-code-per-value list."""
    assert fmt[0] == "<", fmt
    codes = []
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", fmt[1:]):
        codes += [f"{int(count or 1)}s"] if code == "s" else [code] * int(count or 1)
    return codes


def c_string(define: str) -> bytes:
    m = re.fullmatch(r'"([^"\\]*)"', define)
    assert m, define
    return m.group(1).encode()


def test_frame_types():
    assert c_enum("protocol.h", "MG_FRAME_") == {
        "MG_FRAME_TRAIN": frames.TRAIN,
        "MG_FRAME_EVAL": frames.EVAL,
        "MG_FRAME_SAMPLE": frames.SAMPLE,
        "MG_FRAME_CHECKPOINT": frames.CHECKPOINT,
        "MG_FRAME_STOP": frames.STOP,
    }


def test_frame_header_layout_and_magic():
    assert c_struct("protocol.h", "MgFrameHeader") == py_struct(frames.HEADER.format)
    # The magic is checked where the header is read (protocol.h's mg_read_frame_header), against its 4 bytes.
    magics = set(re.findall(r'memcmp\(h->magic,\s*"([^"]*)",\s*4\)', _header("protocol.h")))
    assert magics == {frames.FRAME_MAGIC.decode()}


def test_sample_frame_layout_and_limits():
    assert c_struct("protocol.h", "MgSampleParams") == py_struct(frames.SAMPLE_PARAMS.format)
    assert c_struct("protocol.h", "MgSamplePrompt") == py_struct(frames.SAMPLE_PROMPT.format)
    assert int(c_define("protocol.h", "MG_SAMPLE_MAX_COUNT")) == frames.SAMPLE_MAX_COMPLETIONS


def test_engine_exit_codes():
    assert c_enum("common.h", "MG_EXIT_") == {
        "MG_EXIT_OK": engine_cli.EXIT_OK,
        "MG_EXIT_USAGE": engine_cli.EXIT_USAGE,
        "MG_EXIT_CKPT": engine_cli.EXIT_CHECKPOINT,
        "MG_EXIT_PROTOCOL": engine_cli.EXIT_PROTOCOL,
        "MG_EXIT_IO": engine_cli.EXIT_IO,
        "MG_EXIT_NUMERIC": engine_cli.EXIT_NUMERICS,
    }
    assert set(engine_cli.EXIT_MEANINGS) == set(c_enum("common.h", "MG_EXIT_").values())


def test_checkpoint_trailer_and_footer():
    assert c_string(c_define("checkpoint.h", "MG_TRAILER_MAGIC")) == checkpoint.TRAILER_MAGIC
    assert c_string(c_define("checkpoint.h", "MG_END_MAGIC")) == checkpoint.END_MAGIC
    assert int(c_define("checkpoint.h", "MG_TRAILER_FIXED")) == checkpoint.TRAILER_FIXED_BYTES
    assert int(c_define("checkpoint.h", "MG_FOOTER")) == checkpoint.FOOTER_BYTES
    assert c_struct("checkpoint.h", "MgTrailer") == py_struct(checkpoint._FIXED.format)
    assert c_struct("checkpoint.h", "MgFooter") == py_struct(checkpoint._FOOTER.format)
    meta = re.findall(r"static char meta\[(\d+)\]", _header("checkpoint.h"))
    assert [int(n) for n in meta] == [checkpoint.MAX_META_BYTES]


def test_token_shard_header():
    # The loader reads the header by offsets: the magic's 8 bytes, then version, vocab, n_tokens.
    loader = _header("shard.h")
    assert re.findall(r'memcmp\(head,\s*"([^"]*)",\s*8\)', loader) == [shard.SHARD_MAGIC.decode()]
    assert re.findall(r"version != (\d+)", loader) == [str(shard.SHARD_VERSION)]
    offsets = [int(n) for n in re.findall(r"memcpy\(&\w+(?:\.\w+)?,\s*head \+ (\d+),", loader)]
    fields = shard.HEADER.format  # magic, version, vocab, n_tokens, reserved
    assert offsets == [struct.calcsize(fields[:i]) for i in (3, 4, 5)]
    assert re.findall(r"fread\(head, 1, (\d+), f\)", loader) == [str(shard.HEADER.size)]


def test_the_parsers_can_fail():
    assert py_struct("<8sII9i") == ["8s", "I", "I"] + ["i"] * 9
    with pytest.raises(AssertionError):
        c_struct("protocol.h", "MgNoSuchStruct")
    assert c_struct("protocol.h", "MgSamplePrompt") != py_struct("<IIq")
