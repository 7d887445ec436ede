"""What a mixing evaluation found: per mix and policy, from the runs' `.loss.json` alone.

Per run: the mean validation loss over the target arms at every eval step,
each arm's validation loss, and the mixture of every step. Per policy, over
its seeds: the mean target curve, each seed's final value against uniform's
run with the same seed, the first eval step at which each seed
reaches the final value of uniform's run with the same seed and the first at
which the mean curve reaches the mean of uniform's final values, each arm's final
validation loss against uniform's, the mixture over time, and how far the
mixture moved within MOVE_STEPS steps. The goals are checked for every policy
against the baseline, on every mix:

- GOAL_FINAL_SLACK: its final mean target loss (mean over the seeds) at most
  this much above uniform's;
- GOAL_ARM_SLACK: no target arm ends more than 2% worse than under uniform
  (its final validation loss, averaged over the seeds);
- fewer steps: on the mean curve over the seeds, reach the mean of uniform's
  final target losses in at least GOAL_FEWER_STEPS_CURATION fewer steps than
  uniform's own mean curve on a mix with arms that are not targets (worthless
  or low-quality arms), GOAL_FEWER_STEPS_GOOD on a mix of target arms only.
  The mean curve, because the noise between seeds is larger than the gain
  sought: a seed's step to its own uniform's final value moves by whole
  evaluations (docs/DATA-MIXING.md, "Other seeds"). The per-seed steps stay
  in the summary beside it;
- GOAL_LOW_QUALITY_POINTS: after the first WARMUP_FRACTION of the run, no
  step gives an arm that is not a target more than its floor plus 5 points;
- GOAL_MAX_MOVE: after the first WARMUP_FRACTION of the run, no arm's weight
  moves by more than 0.2 within MOVE_STEPS steps, in any seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from proxy.config.experiment import Experiment
from proxy.formats.loss_log import EvalEntry, StepEntry, iter_lines, parse_line

BASELINE = "uniform"
GOAL_FINAL_SLACK = 0.005
GOAL_ARM_SLACK = 0.02
GOAL_FEWER_STEPS_CURATION = 0.15
GOAL_FEWER_STEPS_GOOD = 0.05
GOAL_LOW_QUALITY_POINTS = 0.05
GOAL_MAX_MOVE = 0.2
MOVE_STEPS = 25
WARMUP_FRACTION = 0.10
MIXTURE_POINTS = 100  # the mixture over time is kept as this many step bins


class SummaryError(ValueError):
    """A run that cannot be summarised (missing, unfinished, or unlike the others); one line."""


@dataclass
class RunSeries:
    eval_steps: np.ndarray  # [E] steps with an evaluation
    eval_loss: dict[str, np.ndarray]  # arm -> [E] validation loss
    steps: np.ndarray  # [S] every logged step
    mixture: np.ndarray  # [S, K] the mixture each step was drawn from, in arm order


def read_run(run_dir: Path, arms: list[str], max_steps: int) -> RunSeries:
    """The evals and mixtures of one finished run (for a step logged twice, the last entry wins)."""
    log = run_dir / ".loss.json"
    if not log.is_file():
        raise SummaryError(f"{run_dir}: no .loss.json (the run never started)")
    steps: dict[int, StepEntry] = {}
    evals: dict[int, EvalEntry] = {}
    for _offset, line in iter_lines(log):
        entry = parse_line(line)
        if isinstance(entry, StepEntry):
            steps[entry.step] = entry
        elif isinstance(entry, EvalEntry):
            evals[entry.step] = entry
    if max_steps not in steps or max_steps not in evals:
        raise SummaryError(
            f"{run_dir}: unfinished (last step {max(steps, default=0)} of {max_steps}, "
            f"last eval {max(evals, default=0)})"
        )
    eval_steps = np.array(sorted(evals))
    missing = sorted({a for e in evals.values() for a in arms if a not in e.arms})
    if missing:
        raise SummaryError(f"{run_dir}: evaluations lack arm(s) {', '.join(missing)}")
    step_ids = np.array(sorted(steps))
    return RunSeries(
        eval_steps=eval_steps,
        eval_loss={a: np.array([evals[s].arms[a] for s in eval_steps]) for a in arms},
        steps=step_ids,
        mixture=np.array([[steps[s].mixture.get(a, 0.0) for a in arms] for s in step_ids]),
    )


def target_curve(run: RunSeries, targets: list[str]) -> np.ndarray:
    """The mean validation loss over the target arms at each eval step."""
    return np.mean([run.eval_loss[a] for a in targets], axis=0)


def first_reach(steps: np.ndarray, curve: np.ndarray, threshold: float) -> int | None:
    """The first eval step at which `curve` is at or below `threshold` (None: never)."""
    hit = np.flatnonzero(curve <= threshold)
    return int(steps[hit[0]]) if hit.size else None


def mean_curve_reach(policy: dict, baseline: dict) -> tuple[int | None, float | None]:
    """The fewer-steps goal's figures: the first eval step at which a summarised policy's target curve, mean
    over its seeds, is at or below the mean of the baseline's final values, and how many fewer steps that is
    than the baseline's own mean curve takes. Read from the summary's rounded curves, so that a summary
    already written gives the same answer as the runs."""
    steps = np.array(policy["target_curve"]["steps"])
    threshold = baseline["target_curve"]["mean"][-1]
    reach = first_reach(steps, np.array(policy["target_curve"]["mean"], dtype=float), threshold)
    base_reach = first_reach(steps, np.array(baseline["target_curve"]["mean"], dtype=float), threshold)
    return reach, (None if reach is None else 1.0 - reach / base_reach)


def low_quality_arms(experiment: Experiment) -> list[str]:
    """The arms that are not targets: the worthless or low-quality ones GOAL_LOW_QUALITY_POINTS is about."""
    return [a.name for a in experiment.arms if not a.target]


def fewer_steps_goal(experiment: Experiment) -> float:
    """How many fewer steps the mix asks for: more where there are arms to curate away."""
    return GOAL_FEWER_STEPS_CURATION if low_quality_arms(experiment) else GOAL_FEWER_STEPS_GOOD


def max_move(steps: np.ndarray, mixture: np.ndarray, after: float, window: int = MOVE_STEPS) -> float:
    """The most any arm's weight moved between two steps at most `window` apart, both after step `after`."""
    keep = steps > after
    steps, mixture = steps[keep], mixture[keep]
    worst = 0.0
    for lag in range(1, window + 1):
        if lag >= len(steps):
            break
        close = (steps[lag:] - steps[:-lag]) <= window
        if close.any():
            worst = max(worst, float(np.abs(mixture[lag:] - mixture[:-lag])[close].max()))
    return worst


def _binned(steps: np.ndarray, mixture: np.ndarray, bins: int) -> tuple[list[int], np.ndarray]:
    """Mean mixture over `bins` equal spans of steps; each labelled by its last step."""
    edges = np.linspace(0, len(steps), min(bins, len(steps)) + 1).round().astype(int)
    means = np.array([mixture[a:b].mean(axis=0) for a, b in zip(edges[:-1], edges[1:], strict=False)])
    return [int(steps[b - 1]) for b in edges[1:]], means


def _r(x: float | None, nd: int = 5):
    return None if x is None else round(float(x), nd)


def summarize_policy(
    policy: str, runs: dict[int, RunSeries], baseline: dict[int, RunSeries], experiment: Experiment
) -> dict:
    """One policy over its seeds, against the baseline's runs with the same seeds."""
    arms, targets = experiment.arm_names, experiment.target_arms
    max_steps = experiment.train.max_steps
    seeds = sorted(runs)
    curves = {s: target_curve(runs[s], targets) for s in seeds}
    base_curves = {s: target_curve(baseline[s], targets) for s in seeds}
    eval_steps = runs[seeds[0]].eval_steps
    base_final = {s: float(base_curves[s][-1]) for s in seeds}
    reach = {s: first_reach(eval_steps, curves[s], base_final[s]) for s in seeds}
    base_reach = {s: first_reach(eval_steps, base_curves[s], base_final[s]) for s in seeds}
    reached_all = all(v is not None for v in reach.values())
    fewer = 1.0 - np.mean(list(reach.values())) / np.mean(list(base_reach.values())) if reached_all else None

    final = float(np.mean([curves[s][-1] for s in seeds]))
    base_final_mean = float(np.mean([base_curves[s][-1] for s in seeds]))
    final_vs_base = final / base_final_mean - 1.0
    final_arm = {a: float(np.mean([runs[s].eval_loss[a][-1] for s in seeds])) for a in arms}
    base_arm = {a: float(np.mean([baseline[s].eval_loss[a][-1] for s in seeds])) for a in arms}
    vs_base = {a: final_arm[a] / base_arm[a] - 1.0 for a in arms}
    worst_target = max(targets, key=lambda a: vs_base[a])

    after = {s: runs[s].steps > WARMUP_FRACTION * max_steps for s in seeds}
    share_after = {
        a: {
            "mean": _r(np.mean([runs[s].mixture[after[s], i].mean() for s in seeds])),
            "max": _r(max(runs[s].mixture[after[s], i].max() for s in seeds)),
        }
        for i, a in enumerate(arms)
    }
    floors = experiment.floors
    low = {
        a: bool(share_after[a]["max"] <= floors[a] + GOAL_LOW_QUALITY_POINTS + 1e-9)
        for a in low_quality_arms(experiment)
    }
    moved = max(max_move(runs[s].steps, runs[s].mixture, WARMUP_FRACTION * max_steps) for s in seeds)

    mean_curve = np.mean([curves[s] for s in seeds], axis=0)
    bin_steps, bin_mix = _binned(
        runs[seeds[0]].steps, np.mean([runs[s].mixture for s in seeds], axis=0), MIXTURE_POINTS
    )
    return {
        "seeds": seeds,
        "final_target_loss": {
            "mean": _r(mean_curve[-1]),
            "per_seed": {str(s): _r(curves[s][-1]) for s in seeds},
            "vs_baseline": _r(final_vs_base),
            # each seed against the baseline's run with that seed: the noise the mean hides
            "vs_baseline_per_seed": {str(s): _r(curves[s][-1] / base_final[s] - 1.0) for s in seeds},
        },
        "steps_to_baseline_final": {
            "per_seed": {str(s): reach[s] for s in seeds},
            "baseline_per_seed": {str(s): base_reach[s] for s in seeds},
            "mean": _r(np.mean(list(reach.values()))) if reached_all else None,
            "fewer_steps": _r(fewer),
        },
        "final_arm_loss": {a: _r(final_arm[a]) for a in arms},
        "final_arm_vs_baseline": {a: _r(vs_base[a]) for a in arms},
        "worst_target_arm": {"arm": worst_target, "vs_baseline": _r(vs_base[worst_target])},
        "share_after_warmup": share_after,
        "max_move": _r(moved),
        "target_curve": {
            "steps": [int(x) for x in eval_steps],
            "mean": [_r(x) for x in mean_curve],
            "min": [_r(x) for x in np.min([curves[s] for s in seeds], axis=0)],
            "max": [_r(x) for x in np.max([curves[s] for s in seeds], axis=0)],
        },
        "arm_curves": {a: [_r(x) for x in np.mean([runs[s].eval_loss[a] for s in seeds], axis=0)] for a in arms},
        "mixture": {"steps": bin_steps, "weights": {a: [_r(x, 4) for x in bin_mix[:, i]] for i, a in enumerate(arms)}},
        "goals": {
            "final_loss": bool(final_vs_base <= GOAL_FINAL_SLACK + 1e-12),
            "no_target_arm_worse": bool(vs_base[worst_target] <= GOAL_ARM_SLACK + 1e-12),
            "fewer_steps": None,  # read on the mean curve over the seeds, once the baseline's is known (summarize)
            "low_quality_at_floor": bool(all(low.values())) if low else None,
            "steady": bool(moved <= GOAL_MAX_MOVE + 1e-12),
        },
    }


def summarize(
    series: dict[tuple[str, int], RunSeries], experiment: Experiment, policies: list[str], default_policy: str
) -> dict:
    """Every policy's summary; `series` maps (policy, seed) to a finished run."""
    if BASELINE not in policies:
        raise SummaryError(f"the evaluation needs the {BASELINE!r} policy as its baseline")
    by_policy = {p: {seed: run for (q, seed), run in series.items() if q == p} for p in policies}
    seeds = sorted(by_policy[BASELINE])
    for p, runs in by_policy.items():
        if sorted(runs) != seeds:
            raise SummaryError(f"policy {p!r} has seeds {sorted(runs)}, {BASELINE!r} has {seeds}")
    steps0 = by_policy[BASELINE][seeds[0]].eval_steps
    for (p, seed), run in series.items():
        if not np.array_equal(run.eval_steps, steps0):
            raise SummaryError(f"run {p} seed {seed} evaluated at other steps than {BASELINE} seed {seeds[0]}")
    arms = experiment.arms
    return {
        "experiment": experiment.name,
        "max_steps": experiment.train.max_steps,
        "eval_every": experiment.train.eval_every,
        "eval_rows": experiment.train.eval_row_count(experiment.model.ctx),
        "arms": [{"name": a.name, "target": a.target, "cap": a.cap, "floor": a.floor} for a in arms],
        "low_quality_arms": low_quality_arms(experiment),
        "baseline": BASELINE,
        "default_policy": default_policy,
        "seeds": seeds,
        "goals": {
            "final_loss_slack": GOAL_FINAL_SLACK,
            "target_arm_slack": GOAL_ARM_SLACK,
            "fewer_steps": fewer_steps_goal(experiment),
            "low_quality_points_over_floor": GOAL_LOW_QUALITY_POINTS,
            "max_move": GOAL_MAX_MOVE,
            "move_steps": MOVE_STEPS,
            "warmup_fraction": WARMUP_FRACTION,
        },
        "policies": with_mean_curve_goal(
            {p: summarize_policy(p, by_policy[p], by_policy[BASELINE], experiment) for p in policies},
            fewer_steps_goal(experiment),
        ),
    }


def with_mean_curve_goal(policies: dict[str, dict], goal: float) -> dict[str, dict]:
    """Each summarised policy with its mean curve's reach of the baseline's final value (beside the per-seed
    figures) and the fewer-steps goal read on it: at least `goal` fewer steps than the baseline's mean curve."""
    baseline = policies[BASELINE]
    for p in policies.values():
        reach, fewer = mean_curve_reach(p, baseline)
        p["steps_to_baseline_final"]["mean_curve"] = {"step": reach, "fewer_steps": _r(fewer)}
        p["goals"]["fewer_steps"] = bool(fewer is not None and fewer >= goal - 1e-12)
    return policies
