"""`proxy run experiments/TINY-TRAIN.json --set train.precision=fp8` on the CPU engine (docs/ENGINE.md,
"FP8"): the engine runs fp8 and the run ends within 2% of the fp32 run's final validation loss."""

from __future__ import annotations

from .conftest import TINY, Proxy, make_experiment, read_entries, run_args, state

FINAL_GAP = 0.02  # the bound on TINY


def final_eval_loss(run_dir) -> float:
    evals = [e for e in read_entries(run_dir) if e["type"] == "eval"]
    assert evals and evals[-1]["step"] == 300, evals[-1:]
    return float(evals[-1]["loss"])


def test_tiny_in_fp8_ends_within_two_percent_of_fp32(engine, data_cache, tmp_path):
    # TINY-TRAIN on one engine thread (as test_end_to_end does): results do not depend on it.
    path = make_experiment(tmp_path, TINY.stem)
    losses, precisions = {}, {}
    for precision in ("auto", "fp8"):
        run_dir = tmp_path / precision
        proxy = Proxy(run_args(path, run_dir, "--set", f"train.precision={precision}"), data_cache).start()
        assert proxy.wait() == 0, proxy.output()
        losses[precision] = final_eval_loss(run_dir)
        precisions[precision] = state(run_dir)["engine"]["precision"]
    assert precisions == {"auto": "fp32", "fp8": "fp8"}
    assert losses["fp8"] != losses["auto"], "fp8 and fp32 gave the same loss: the flag changed nothing"
    gap = abs(losses["fp8"] - losses["auto"]) / losses["auto"]
    assert gap <= FINAL_GAP, losses
    print(f"TINY final validation loss: fp32 {losses['auto']:.4f}, fp8 {losses['fp8']:.4f}, gap {gap:.4f}")
