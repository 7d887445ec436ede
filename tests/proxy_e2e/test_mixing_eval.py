"""The curation experiment end to end: real proxies and engines, TINY's model with a junk and a
duplicates arm. The target policy (which reads the evaluations) and the progress policy resume bit
for bit after a kill, and scripts/eval_mixing.py runs, summarises, plots (or says why not), writes
the doc's tables and compares summaries."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.gate import KILL_SLACK

from .conftest import REPO, TINY, Proxy, last_steps, max_logged_step, proxy_env, run_args, wait_for

MAX_STEPS = 90
CURATION_ARMS = [
    {"name": "junk", "sources": [{"builtin": "random_tokens"}], "floor": 0.02, "target": False},
    {"name": "dup", "sources": [{"builtin": "repeated_names"}], "floor": 0.02, "target": False},
]


def curation_experiment(directory: Path, name: str, policy: str, all_targets: bool = False, **train) -> Path:
    """TINY-TRAIN plus a junk and a duplicates arm (targets too with `all_targets`), one engine thread,
    the given policy."""
    exp = json.loads(TINY.read_text())
    exp["name"] = name
    exp["arms"] += [{**a, "target": all_targets} for a in CURATION_ARMS]
    exp["bandit"] = {"policy": policy}
    exp["train"].update(
        {
            "threads": 1,
            "max_steps": MAX_STEPS,
            "ckpt_every": 20,
            "eval_every": 30,
            "sample_every": 0,
            "keep_last": 2,
            "milestone_every": 0,
            **train,
        }
    )
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(exp, indent=1))
    return path


@pytest.mark.parametrize(
    "policy, opening, kill_at", [("target", None, 52), ("progress", None, 52), ("target", 0.5, 22)]
)
def test_policy_resumes_with_the_same_mixtures(engine, gate, data_cache, tmp_path, policy, opening, kill_at):
    """A proxy killed mid-run (after checkpoints, with steps and evaluations past the newest one
    logged) and relaunched rebuilds the bandit from .loss.json, the target policy's evaluations
    included: every step's mixture and loss is the uninterrupted run's, bit for bit. (Every arm is
    a target in the first two, so the junk arm's flat validation loss moves the target policy's
    mixture. In the third the junk and the duplicates are not targets and the opening is half the
    run, 45 steps: the kill lands in it, while it feeds the duplicates.)"""
    exp = curation_experiment(tmp_path, "CURATE", policy, all_targets=opening is None, eval_every=10)
    if opening is not None:
        data = json.loads(exp.read_text())
        data["bandit"]["opening"] = opening
        data["train"]["ckpt_every"] = 10
        exp.write_text(json.dumps(data, indent=1))
    straight = tmp_path / "straight"
    proxy = Proxy(run_args(exp, straight), data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    gap_line = "unigram gap of the other arms to the targets (the target policy's opening): junk -"
    assert (gap_line in proxy.output()) is (opening is not None)  # the line with arms not marked target

    resumed = tmp_path / "resumed"
    args = run_args(exp, resumed, engine=gate.engine_flag)
    gate.hold_after(kill_at + KILL_SLACK)  # however fast the engine, the kill lands near step kill_at
    proxy = Proxy(args, data_cache).start()
    wait_for(lambda: max_logged_step(resumed) >= kill_at, 240, f"step {kill_at}", proxy, poll=0.005)
    proxy.kill_group()  # the engine, in its own session, is reaped by the relaunched proxy
    proxy.proc.wait(30)
    gate.open()
    proxy = Proxy(args, data_cache).start()
    assert proxy.wait() == 0, proxy.output()

    a, b = last_steps(straight), last_steps(resumed)
    assert sorted(a) == sorted(b) == list(range(1, MAX_STEPS + 1))
    fields = ("mixture", "arms", "loss")
    diffs = [s for s in a if any(a[s][f] != b[s][f] for f in fields)]
    assert not diffs, f"steps differ after the resume: {diffs[:10]}"
    mixtures = {tuple(a[s]["mixture"].values()) for s in a}
    assert len(mixtures) > (10 if opening is None else 1)  # the policy did move the mixture
    if opening is not None:  # the opening fed the duplicates (in part: TINY's vocabulary is small) from step 1,
        # not the junk; both at their floors by step 46
        assert a[1]["mixture"]["dup"] == a[22]["mixture"]["dup"] > 0.02 and a[1]["mixture"]["junk"] == 0.02
        assert a[46]["mixture"]["junk"] == a[46]["mixture"]["dup"] == 0.02
    assert min(b[s]["segment"] for s in b) == 1 and max(b[s]["segment"] for s in b) == 2


def run_script(args: list[str], cache: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = proxy_env(cache)
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "eval_mixing.py"), *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_eval_mixing_end_to_end(engine, data_cache, tmp_path):
    exp = curation_experiment(tmp_path, "EVAL", "target", max_steps=40, eval_every=10)
    runs, summary, plots = tmp_path / "runs", tmp_path / "summary.json", tmp_path / "img"
    doc = tmp_path / "DOC.md"
    sys.path.insert(0, str(REPO / "scripts"))
    from mixing.report import BEGIN, END  # noqa: PLC0415 - the script's own markers

    doc.write_text(f"# Doc\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n")
    common = [
        "--experiment",
        str(exp),
        "--policies",
        "uniform",
        "target",
        "--seeds",
        "3",
        "--runs-dir",
        str(runs),
        "--summary",
        str(summary),
        "--plots",
        str(plots),
    ]
    done = run_script([*common, "--jobs", "2", "--doc", str(doc), "--no-progress"], data_cache)
    assert done.returncode == 0, done.stdout + done.stderr

    whole = json.loads(summary.read_text())
    assert list(whole["mixes"]) == ["EVAL"]
    s = whole["mixes"]["EVAL"]
    assert s["default_policy"] == "target" and s["baseline"] == "uniform" and s["seeds"] == [3]
    assert s["low_quality_arms"] == ["junk", "dup"] and [a["target"] for a in s["arms"]] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert s["goals"]["fewer_steps"] == 0.15  # a mix with arms to curate away
    uni, tgt = s["policies"]["uniform"], s["policies"]["target"]
    assert uni["target_curve"]["steps"] == [10, 20, 30, 40] == tgt["target_curve"]["steps"]
    reach = uni["steps_to_baseline_final"]  # uniform against itself: the same steps, none fewer
    assert reach["per_seed"] == reach["baseline_per_seed"] and reach["fewer_steps"] == 0
    assert reach["mean_curve"] == {"step": reach["per_seed"]["3"], "fewer_steps": 0.0}  # its mean curve: one seed
    assert reach["per_seed"]["3"] in (10, 20, 30, 40)
    assert all(abs(w - 0.2) < 1e-9 for ws in uni["mixture"]["weights"].values() for w in ws)
    assert uni["max_move"] == 0 and uni["final_target_loss"]["vs_baseline"] == 0
    assert uni["final_target_loss"]["vs_baseline_per_seed"] == {"3": 0.0}  # each seed against the same seed's
    final = {p: s["policies"][p]["final_target_loss"]["per_seed"]["3"] for p in ("uniform", "target")}
    assert abs(tgt["final_target_loss"]["vs_baseline_per_seed"]["3"] - (final["target"] / final["uniform"] - 1)) < 1e-4
    target_mean = sum(uni["final_arm_loss"][a] for a in ("code", "docstrings", "topics")) / 3
    assert abs(target_mean - uni["final_target_loss"]["mean"]) < 1e-4
    assert set(tgt["goals"]) == {"final_loss", "no_target_arm_worse", "fewer_steps", "low_quality_at_floor", "steady"}
    assert tgt["share_after_warmup"]["junk"]["max"] == 0.02  # the target policy gives a non-target its floor
    assert whole["how"]["wall_s"] > 0 and set(whole["how"]["run_wall_s"]) == {"EVAL-uniform-s3", "EVAL-target-s3"}
    assert whole["how"]["finished_before"] == [] and "for 2 runs, 2 at a time" in done.stdout
    assert sorted(p.name for p in plots.iterdir()) == ["mixing-mixtures.png", "mixing-target-loss.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots.iterdir())
    text = doc.read_text()
    assert "old table" not in text and text.startswith("# Doc\n\nbefore\n") and text.endswith(f"{END}\nafter\n")
    assert "| **target** (default) |" in text and "| uniform |" in text and "### EVAL" in text
    assert "| +0.0% (+0.0) |" in text  # uniform against itself, over the seeds and then seed 3's
    assert {p.name for p in runs.iterdir()} >= {"EVAL-uniform-s3", "EVAL-target-s3"}  # the dashboard's runs

    # again: the finished runs are not trained twice; without matplotlib, no PNG and one line why
    hide = tmp_path / "no-matplotlib" / "matplotlib"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = {"PYTHONPATH": f"{hide.parent}{os.pathsep}{REPO}"}
    again = run_script([*common, "--plots", str(tmp_path / "img2"), "--no-progress"], data_cache, env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "matplotlib is not installed" in again.stdout and not (tmp_path / "img2").exists()
    assert json.loads(summary.read_text())["mixes"] == whole["mixes"]
    assert sorted(json.loads(summary.read_text())["how"]["finished_before"]) == ["EVAL-target-s3", "EVAL-uniform-s3"]
    assert "for 0 runs (2 more were finished already and only read)" in again.stdout  # the time is not theirs
    for name in ("EVAL-uniform-s3", "EVAL-target-s3"):
        assert "nothing to do" in (runs / "logs" / f"{name}.log").read_text()

    # --compare: the same results pass; a changed number is found, named (its field), and exits 1
    same = run_script(
        [
            *common,
            "--report-only",
            "--summary",
            str(tmp_path / "again.json"),
            "--compare",
            str(summary),
            "--plots",
            str(tmp_path / "img2"),
        ],
        data_cache,
        env,
    )
    assert same.returncode == 0 and "equal those in" in same.stdout, same.stdout + same.stderr
    assert "eval_mixing: compare EVAL: identical\n" in same.stdout
    changed = json.loads(summary.read_text())
    changed["mixes"]["EVAL"]["policies"]["target"]["max_move"] += 1e-5
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    differ = run_script(
        [
            *common,
            "--report-only",
            "--summary",
            str(tmp_path / "again.json"),
            "--compare",
            str(tmp_path / "changed.json"),
            "--plots",
            str(tmp_path / "img2"),
        ],
        data_cache,
        env,
    )
    assert differ.returncode == 1 and "1 of 1 mixes differ from" in differ.stderr, differ.stdout + differ.stderr
    assert "eval_mixing: compare EVAL: policies.target.max_move: " in differ.stdout and differ.stderr.count("\n") == 1

    # the plots and the doc's tables from the summary alone; bad input is one line and exit 2
    doc.write_text(f"{BEGIN}\n{END}\n")
    written = summary.read_bytes()
    redraw = ["--from-summary", "--summary", str(summary), "--plots", str(tmp_path / "img3")]
    assert run_script([*redraw, "--doc", str(doc)], data_cache).returncode == 0
    assert "| **target** (default) |" in doc.read_text() and len(list((tmp_path / "img3").iterdir())) == 2
    from mixing.report import markers  # noqa: PLC0415

    begin, end = markers("policies")  # a second block of the same doc, named
    doc.write_text(f"{BEGIN}\nkept\n{END}\n{begin}\n{end}\n")
    assert run_script([*redraw, "--doc", str(doc), "--doc-block", "policies"], data_cache).returncode == 0
    assert (
        doc.read_text().startswith(f"{BEGIN}\nkept\n{END}\n{begin}\n") and "| **target** (default) |" in doc.read_text()
    )
    assert summary.read_bytes() == written  # the summary itself is left alone
    nomarks = tmp_path / "NOMARKS.md"
    nomarks.write_text("no markers\n")
    bad = run_script([*redraw, "--doc", str(nomarks)], data_cache)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "markers" in bad.stderr
    assert nomarks.read_text() == "no markers\n"
    bad = run_script(["--from-summary", "--summary", str(nomarks)], data_cache)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a mixing summary" in bad.stderr
    bad = run_script(["--policies", "progress", "--seeds", "1"], data_cache)
    assert bad.returncode == 2 and "must include uniform" in bad.stderr and bad.stderr.count("\n") == 1
    bad = run_script(["--compare", str(nomarks)], data_cache)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a mixing summary" in bad.stderr


def test_eval_mixing_stops_its_runs_on_sigterm(engine, data_cache, tmp_path):
    """SIGTERM to the evaluation stops the runs in flight (they live in their own sessions): one line,
    exit 130, no proxy left running, and the same command resumes them."""
    exp = curation_experiment(tmp_path, "STOP", "target", max_steps=400, eval_every=50)
    runs = tmp_path / "runs"
    args = [
        sys.executable,
        str(REPO / "scripts" / "eval_mixing.py"),
        "--experiment",
        str(exp),
        "--seeds",
        "1",
        "--runs-dir",
        str(runs),
        "--summary",
        str(tmp_path / "s.json"),
        "--plots",
        str(tmp_path / "img"),
        "--no-progress",
    ]
    proc = subprocess.Popen(
        args,
        cwd=REPO,
        env=proxy_env(data_cache),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    logs = [runs / "STOP-uniform-s1" / ".loss.json", runs / "STOP-target-s1" / ".loss.json"]
    wait_for(lambda: all(p.exists() and p.stat().st_size > 0 for p in logs), 240, "both runs training")
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.count("\n") == 1 and "interrupted" in err, err
    running = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(runs) not in running  # no orphaned proxy or engine
    for name in ("STOP-uniform-s1", "STOP-target-s1"):
        assert "stopped" in (runs / "logs" / f"{name}.log").read_text().lower()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policies", "uniform", "greedy"], "unknown policy greedy"),
        (["--seeds", "1", "1"], "must not repeat"),
        (["--jobs", "0"], "--jobs must be at least 1"),
        (["--mix", "good", "nope"], "unknown mix nope"),
        (["--mix", "good", "--experiment", "x.json"], "--mix and --experiment exclude each other"),
        (["--doc-block", "a b"], "--doc-block must be letters, digits"),
        (["--summary", "s.json", "--compare", "s.json"], "--summary and --compare both name s.json"),
    ],
)
def test_eval_mixing_bad_arguments(data_cache, args, message):
    bad = run_script(args, data_cache)
    assert bad.returncode == 2 and message in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


def test_max_move_and_the_goals_of_a_mix():
    """The steadiness figure: the most any arm's weight moves between two steps at most 25 apart, after
    the warmup; the fewer-steps goal of a mix follows from whether it has arms that are not targets."""
    sys.path.insert(0, str(REPO / "scripts"))
    import numpy as np  # noqa: PLC0415
    from mixing.summary import fewer_steps_goal, low_quality_arms, max_move  # noqa: PLC0415

    from proxy.config.experiment import load_experiment  # noqa: PLC0415

    steps = np.arange(1, 201)
    mix = np.tile([0.5, 0.5], (200, 1))
    mix[100:, 0] = np.clip(0.5 + 0.01 * (steps[100:] - 100), 0, 0.9)  # a ramp of 0.01 per step from step 101
    mix[:, 1] = 1 - mix[:, 0]
    assert max_move(steps, mix, after=0) == pytest.approx(0.25)  # 25 steps of the ramp
    assert max_move(steps, mix, after=180) == pytest.approx(0.0)  # the ramp is over by then (capped at 0.9)
    jump = mix.copy()
    jump[50:, :] = [0.1, 0.9]
    assert max_move(steps, jump, after=49) == pytest.approx(0.4) and max_move(steps, jump, after=50) < 0.4
    gaps = np.array([1, 2, 40, 41])  # steps 40 apart are not within 25 steps of each other
    assert max_move(gaps, np.array([[0.5], [0.5], [0.9], [0.9]]), after=0) == 0
    good = load_experiment(REPO / "experiments" / "MIXING-GOOD.json")
    worthless = load_experiment(REPO / "experiments" / "MIXING-WORTHLESS.json")
    assert low_quality_arms(good) == [] and fewer_steps_goal(good) == 0.05
    assert low_quality_arms(worthless) == ["junk", "duplicates"] and fewer_steps_goal(worthless) == 0.15


def test_the_mean_curve_reach_beside_the_goal():
    """The mean curve's step: the first eval at which the policy's target loss, mean over its seeds, is at or
    below the mean of the baseline's final values; fewer steps against the baseline's own mean curve."""
    sys.path.insert(0, str(REPO / "scripts"))
    from mixing.summary import mean_curve_reach  # noqa: PLC0415

    def summarised(mean):
        return {"target_curve": {"steps": [20, 40, 60, 80, 100], "mean": mean}}

    baseline = summarised([6.0, 5.5, 5.2, 5.05, 5.0])
    assert mean_curve_reach(summarised([6.0, 5.4, 5.0, 4.9, 4.8]), baseline) == (60, pytest.approx(0.4))
    assert mean_curve_reach(summarised([6.0, 5.5, 5.2, 5.1, 5.01]), baseline) == (None, None)  # never
    assert mean_curve_reach(baseline, baseline) == (100, pytest.approx(0.0))
    early = summarised([6.0, 5.5, 4.99, 5.05, 5.0])  # a baseline whose curve dips below its final value first
    assert mean_curve_reach(summarised([6.0, 4.99, 5.0, 5.0, 5.0]), early) == (40, pytest.approx(1 / 3))


def test_the_fewer_steps_goal_reads_the_mean_curve():
    """The goal is met when the mean curve over the seeds reaches the baseline's mean final value early
    enough, even where a seed never reaches its own baseline's (the per-seed figures stay beside it), and
    missed when the mean curve is too late, even where the per-seed mean says more."""
    sys.path.insert(0, str(REPO / "scripts"))
    from mixing.summary import with_mean_curve_goal  # noqa: PLC0415

    def summarised(mean, per_seed_fewer):
        return {
            "target_curve": {"steps": [20, 40, 60, 80, 100], "mean": mean},
            "steps_to_baseline_final": {"per_seed": {"1": None}, "fewer_steps": per_seed_fewer},
            "goals": {"final_loss": True, "fewer_steps": None, "steady": True},
        }

    policies = with_mean_curve_goal(
        {
            "uniform": summarised([6.0, 5.5, 5.2, 5.05, 5.0], 0.0),
            "early": summarised([6.0, 5.4, 5.0, 4.9, 4.8], None),
            "late": summarised([6.0, 5.5, 5.2, 5.0, 4.9], 0.5),
        },
        goal=0.15,
    )
    early, late, base = policies["early"], policies["late"], policies["uniform"]
    assert early["steps_to_baseline_final"]["mean_curve"] == {"step": 60, "fewer_steps": 0.4}
    assert early["goals"]["fewer_steps"] is True and early["steps_to_baseline_final"]["fewer_steps"] is None
    assert late["steps_to_baseline_final"]["mean_curve"] == {"step": 80, "fewer_steps": 0.2}
    assert with_mean_curve_goal({"uniform": base, "late": late}, goal=0.25)["late"]["goals"]["fewer_steps"] is False
    assert base["goals"]["fewer_steps"] is False  # the baseline is 0% ahead of itself
    assert list(early["goals"]) == ["final_loss", "fewer_steps", "steady"]  # the order of the summary's keys kept
