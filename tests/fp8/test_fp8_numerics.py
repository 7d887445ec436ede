"""microgpt/fp8.h against PyTorch's float8_e4m3fn and float8_e5m2 casts (an independent implementation):
every code decodes to torch's value and encodes back to itself, rounding ties go to even, and the stated
rules where the two differ on purpose (saturation, infinities) and for the per-tensor scale."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).resolve().parent
FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("fp8") / "fp8_probe"
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-Werror", "-o", exe, HERE / "fp8_probe.c", "-lm"], check=True)
    return exe


def run(probe: Path, mode: str, fmt: str, data: np.ndarray | None = None) -> bytes:
    stdin = b"" if data is None else np.ascontiguousarray(data, dtype=np.float32).tobytes()
    return subprocess.run([probe, mode, fmt], input=stdin, capture_output=True, check=True).stdout


def encode(probe: Path, fmt: str, x: np.ndarray) -> np.ndarray:
    return np.frombuffer(run(probe, "encode", fmt, x), dtype=np.uint8)


def torch_codes(fmt: str, x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x.astype(np.float32)).to(FORMATS[fmt][0]).view(torch.uint8).numpy()


def all_codes(fmt: str) -> np.ndarray:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FORMATS[fmt][0]).float().numpy()


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_code_decodes_as_torch_and_round_trips(probe, fmt):
    ours = np.frombuffer(run(probe, "decode", fmt), dtype=np.float32)
    theirs = all_codes(fmt)
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    finite = ~np.isnan(theirs)
    assert np.array_equal(ours[finite].view(np.uint32), theirs[finite].view(np.uint32))  # -0 included
    codes = np.arange(256, dtype=np.uint8)
    back = encode(probe, fmt, ours)
    assert np.array_equal(back[finite], codes[finite])
    assert np.all(np.isnan(np.frombuffer(run(probe, "decode", fmt), dtype=np.float32)[back[~finite]]))
    assert int(np.isnan(ours).sum()) == (2 if fmt == "e4m3" else 6)  # e4m3: S.1111.111; e5m2: 3 NaNs a sign


@pytest.mark.parametrize("fmt", FORMATS)
def test_ties_go_to_even_and_neighbours_round_to_nearest(probe, fmt):
    values = all_codes(fmt)
    finite = np.sort(np.unique(values[np.isfinite(values) & (values >= 0)]))
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)  # exact: few bits
    assert np.array_equal(mids.astype(np.float64), (finite[:-1].astype(np.float64) + finite[1:]) / 2)
    below, above = np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf))
    x = np.concatenate([mids, below, above])
    x = np.concatenate([x, -x])
    assert np.array_equal(encode(probe, fmt, x), torch_codes(fmt, x))
    # Ties by hand: each midpoint goes to the neighbour whose code is even.
    tie_codes = encode(probe, fmt, mids)
    assert np.all(tie_codes % 2 == 0)
    lo, hi = torch_codes(fmt, finite[:-1]), torch_codes(fmt, finite[1:])
    assert np.array_equal(tie_codes, np.where(lo % 2 == 0, lo, hi))


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_values_in_range_match_torch(probe, fmt):
    rng = np.random.default_rng(41)
    top = FORMATS[fmt][1]
    mag = np.exp(rng.uniform(np.log(2.0**-30), np.log(top), 200_000)).astype(np.float32)
    x = mag * rng.choice(np.array([-1, 1], dtype=np.float32), mag.size)
    x = np.concatenate([x, np.float32([0.0, -0.0, top, -top, 1e-45, -1e-45, 1.1754942e-38])])
    assert np.array_equal(encode(probe, fmt, x), torch_codes(fmt, x))


@pytest.mark.parametrize("fmt", FORMATS)
def test_saturation_and_non_finite_rules(probe, fmt):
    top = FORMATS[fmt][1]
    big = np.float32([np.nextafter(np.float32(top), np.float32(np.inf)), top * 1.2, 3e38])
    x = np.concatenate([big, -big])
    assert np.array_equal(encode(probe, fmt, x), torch_codes(fmt, np.clip(x, -top, top)))  # finite saturates
    nan, inf, ninf = encode(probe, fmt, np.float32([np.nan, np.inf, -np.inf]))
    decoded = np.frombuffer(run(probe, "decode", fmt), dtype=np.float32)
    assert np.isnan(decoded[nan])
    if fmt == "e4m3":  # no infinity: stays non-finite as NaN
        assert np.isnan(decoded[inf]) and np.isnan(decoded[ninf])
    else:
        assert decoded[inf] == np.inf and decoded[ninf] == -np.inf


@pytest.mark.parametrize("fmt", FORMATS)
def test_scale_is_the_largest_power_of_two_that_fits(probe, fmt):
    top = FORMATS[fmt][1]
    rng = np.random.default_rng(7)
    amax = np.exp(rng.uniform(np.log(1e-20), np.log(1e20), 20_000)).astype(np.float32)
    amax = np.concatenate([amax, np.float32([top, top / 2, np.nextafter(np.float32(top), np.float32(0)), 1.0])])
    k = np.frombuffer(run(probe, "scale", fmt, amax), dtype=np.int32)
    a = amax.astype(np.float64)
    assert np.all(a * 2.0 ** k.astype(np.float64) <= top)
    assert np.all(a * 2.0 ** (k.astype(np.float64) + 1) > top)
    special = np.float32([0.0, np.inf, np.nan, 1e-40, 1e38])
    k0, kinf, knan, ktiny, kbig = np.frombuffer(run(probe, "scale", fmt, special), dtype=np.int32)
    assert (k0, kinf, knan) == (0, 0, 0)  # all zeros, or no finite amax: scale 1
    assert ktiny == 100 and -100 <= kbig < 0  # clamped exponent
