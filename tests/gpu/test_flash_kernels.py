"""The flash attention kernels alone (build/flash_attention_check, from
tests/gpu/flash_attention_check.cu) against a float64 attention on the same
bf16 inputs: head dims 32, 64, 128 at T = 1, 64, 100 (not a multiple of the
64-row tile) and 1024. Outputs are poisoned with NaN before every launch, so
an element no kernel writes fails the test; each case runs twice and must
repeat bit for bit."""

from __future__ import annotations

import json
import subprocess

# bf16 operands with fp32 accumulation: about 2e-3 norm-relative error is
# expected (the bf16 rounding of y, dqkv, and of P and dS before their
# products). 1e-2 leaves a margin of five; an indexing or masking error is
# O(1). Per head row, the worst row's error against the RMS row norm: 5e-2.
NORM_BOUND = 1e-2
ROW_BOUND = 5e-2
LSE_BOUND = 1e-5  # fp32 arithmetic on exact bf16 scores
EXPECTED = {(hd, T) for hd in (32, 64, 128) for T in (1, 64, 100, 1024)}


def test_flash_kernels_match_float64_reference(flash_check_bin):
    out = subprocess.run([str(flash_check_bin)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr}"
    cases = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert {(c["hd"], c["T"]) for c in cases} == EXPECTED, out.stdout
    bad = []
    for c in cases:
        where = f"hd {c['hd']} T {c['T']}"
        if c["nonfinite"]:
            bad.append(f"{where}: {c['nonfinite']} outputs unwritten or not finite")
        if not c["bitwise_repeat"]:
            bad.append(f"{where}: a second run gave different bits")
        for name in ("y", "dq", "dk", "dv"):
            if not c[name] <= NORM_BOUND:
                bad.append(f"{where}: {name} norm-relative error {c[name]:.3g} > {NORM_BOUND}")
            if not c[name + "_row"] <= ROW_BOUND:
                bad.append(f"{where}: {name} worst-row error {c[name + '_row']:.3g} > {ROW_BOUND}")
        if not c["lse"] <= LSE_BOUND:
            bad.append(f"{where}: lse error {c['lse']:.3g} > {LSE_BOUND}")
    assert not bad, "\n".join(bad)


def test_flash_check_rejects_unknown_arguments(flash_check_bin):
    out = subprocess.run([str(flash_check_bin), "--bogus"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage" in out.stderr
