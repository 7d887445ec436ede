"""Target: the mixture that serves the arms the user marked `target`, judged by their held-out losses.

The objective is the one the user declared: the mean validation loss of the
target arms (docs/EXPERIMENTS.md, `target`). The evidence is every
evaluation's per-arm validation loss, on the same fixed rows each time, so a
change between two evaluations is the model's, not the sample's. Per arm k,
over the last `eval_window` evaluations:

    speed_k = -(least-squares slope of arm k's validation loss against the step)
    se_k    = the standard error of that slope (from the fit's residuals)
    S       = the mean speed of the target arms (how fast the objective falls)

- Each target arm has a quietness q_k = (the smallest target row spread /
  its own)^2 (data/row_spread.py, measured on the training rows before the
  first step; 1 for every target without spreads). The first hundred steps
  decide most of where a run ends, before any evaluation can say anything
  (docs/DATA-MIXING.md, "What a policy cannot see"), and a batch of a few
  rows pays for the rows' disagreement in gradient noise: the quieter arms
  get more of the batch from the first step on.
- A target arm keeps its share while it may still learn: its value is
  q_k * clip((speed_k + 2 se_k) / (stall * S) - 1, 0, 1), q_k while even the
  optimistic speed is at twice `stall` of the objective's or more, 0 once it
  is at `stall` or less. An arm whose validation loss has stopped falling (a
  small arm learned by heart, one that cannot be learned) gives its rows to
  the target arms that still learn; the noise between evaluations does not
  (two arms alike keep even shares), and the dead zone keeps it from buying
  a stalled arm's rows back.
- Any other arm has value 0 and keeps its floor (after the opening, below).
  Whether an arm's rows help the targets shows only when its share changes
  and the targets' losses answer; at this scale that answer is smaller
  than the noise between two evaluations, and the arm's own validation loss
  says nothing of it (docs/DATA-MIXING.md, "What a policy cannot see").

The goal: every arm its floor, `explore` of the rest evenly over the target
arms (a stalled one keeps a few rows, to show when it learns again), the rest
in proportion to value within the caps; what the caps leave over goes evenly
to the target arms below their caps, then to the others (`allocate`). Until
MIN_EVALS evaluations, and while the objective does not fall, the goal stays:
at first the prior, the allocation of the quietness (value = q_k for every
target), every other arm at its floor.

The opening (the first `opening` of the `max_steps` of a run that starts at
step 0; a phase that starts later has max_steps 0): an arm not marked
`target` may still teach the targets, and what it teaches counts most in
the run's first steps (docs/DATA-MIXING.md, "The opening"). An arm that the
model learns far faster than the targets from the first step (its unigram
gap, data/row_spread.py, more than EASY_GAP; fully at twice that) is fed up
to its cap from the first step until the opening's way back, which takes
every arm to the goal above by the opening's last step.
Within the opening the mixture moves by at most OPENING_MOVE per step.

After the opening the mixture moves towards the goal by at most `max_move`
per step for any arm (a convex step, so the caps, the floors and the sum
hold): no arm's weight moves by more than 25 * max_move within 25 steps.

A pure function of its arguments (the row spreads and the unigram gaps are
pure functions of the prepared data) and its observe() and observe_eval()
calls in order: the supervisor gives it each step's losses and, after its
step, each evaluation logged in `.loss.json`, live and in the replay alike.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

from .base import Bandit
from .learning_progress import fill

MIN_EVALS = 3  # evaluations before the first speed: two intervals
CONFIDENCE = 2.0  # standard errors of optimism before a target arm counts as slowed
# The opening. EASY_GAP: the suite's repeated names are 1.28 nats below the targets at the unigram stage;
# a target arm is at most 0.17 from the targets' mean, a realistic low-quality arm at most 0.10 above it
# (docs/DATA-MIXING.md, "The opening"). OPENING_MOVE: fast enough to go from a cap of 0.5 back to a floor
# in 10 steps, so the opening can feed and give back within the first tenth of a short run.
EASY_GAP = 0.5
OPENING_MOVE = 0.05


def slope_and_error(steps: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """The least-squares slope of `values` against `steps` and its standard error (0 through two points)."""
    dt = steps - steps.mean()
    sxx = float(dt @ dt)
    slope = float(dt @ (values - values.mean())) / sxx
    residuals = values - values.mean() - slope * dt
    dof = len(steps) - 2
    return slope, (float(np.sqrt(residuals @ residuals / dof / sxx)) if dof > 0 else 0.0)


def allocate(
    value: np.ndarray, is_target: np.ndarray, floors: np.ndarray, caps: np.ndarray, explore: float
) -> np.ndarray:
    """Every arm its floor, `explore` of the spare mass evenly over the target arms, the rest in
    proportion to `value`; mass the caps leave over goes evenly to the target arms below their caps
    first, then to the others (an arm outside the objective gets rows only when the caps leave no other
    place for them)."""
    w = fill(floors, is_target.astype(np.float64), caps, explore * (1.0 - floors.sum()))
    for free in (value > 0, is_target, np.ones_like(is_target)):
        rest = 1.0 - w.sum()
        if rest <= 0:
            break
        w = fill(w, np.where(free, value, 0.0), np.where(free, caps, w), rest)
    return w


def others_then_targets(
    share: np.ndarray, quiet: np.ndarray, is_target: np.ndarray, floors: np.ndarray, caps: np.ndarray
) -> np.ndarray:
    """Every arm its floor, each arm outside the objective up to `share` (within its cap, scaled down where
    the floors leave too little), the rest to the target arms in proportion to `quiet` within their caps,
    and what their caps leave over to the others."""
    extra = np.where(is_target, 0.0, np.clip(share, floors, caps) - floors)
    room = 1.0 - floors.sum()
    if extra.sum() > room:
        extra *= room / extra.sum()
    w = floors + extra
    w = fill(w, np.where(is_target, quiet, 0.0), np.where(is_target, caps, w), 1.0 - w.sum())
    return fill(w, np.ones_like(w), caps, 1.0 - w.sum())


def easiness(arm_names: Sequence[str], is_target: np.ndarray, unigram_gap: Mapping[str, float] | None) -> np.ndarray:
    """Per arm not a target, how far the model learns it faster than the targets from the first step:
    clip(gap / EASY_GAP - 1, 0, 1) of its unigram gap (data/row_spread.py); 0 for the target arms and for
    an arm without a finite gap."""
    given = unigram_gap or {}
    gap = np.array([float(given.get(n, np.nan)) for n in arm_names])
    ease = np.clip(np.nan_to_num(gap, nan=0.0, posinf=0.0, neginf=0.0) / EASY_GAP - 1.0, 0.0, 1.0)
    return np.where(is_target, 0.0, ease)


def quietness(arm_names: Sequence[str], is_target: np.ndarray, row_spread: Mapping[str, float] | None) -> np.ndarray:
    """Each target arm's weight in the prior, (the smallest target row spread / its own)^2: 1 for the
    quietest, less for an arm whose rows disagree more (data/row_spread.py); 0 for the other arms. Without
    a positive, finite spread for every target arm, 1 for each (the targets' even share)."""
    given = row_spread or {}
    spread = np.array([float(given.get(n, np.nan)) for n in arm_names])[is_target]
    quiet = np.zeros(len(arm_names))
    if spread.size and np.all(np.isfinite(spread)) and np.all(spread > 0):
        quiet[is_target] = (spread.min() / spread) ** 2
    else:
        quiet[is_target] = 1.0
    return quiet


class Target(Bandit):
    policy = "target"

    def __init__(
        self,
        arm_names: Sequence[str],
        caps: Mapping[str, float],
        floors: Mapping[str, float],
        targets: Sequence[str] | None = None,
        row_spread: Mapping[str, float] | None = None,
        ema_alpha: float = 0.1,
        eval_window: int = 10,
        stall: float = 0.25,
        explore: float = 0.05,
        max_move: float = 0.006,
        opening: float = 0.1,
        max_steps: int = 0,
        unigram_gap: Mapping[str, float] | None = None,
    ):
        super().__init__(arm_names, caps, floors, ema_alpha)  # ema_alpha: the EMA .state.json shows
        names = self.arm_names if targets is None else list(targets)
        unknown = [t for t in names if t not in self.index]
        if unknown or not names:
            raise ValueError(f"targets must be some of the arms (got {names})")
        self.is_target = np.array([n in names for n in self.arm_names])
        self.stall = float(stall)
        self.explore = float(explore)
        self.max_move = float(max_move)
        self.evals: deque = deque(maxlen=int(eval_window))  # (step, validation loss per arm) of the last evals
        self.quiet = quietness(self.arm_names, self.is_target, row_spread)
        self.value = np.zeros(self.k)
        self.prior = allocate(self.quiet, self.is_target, self.floors, self.caps, self.explore)
        self.goal = self.prior
        # The opening: the easy arms fed from the first step until feed_until, every arm back by opening_steps.
        self.ease = easiness(self.arm_names, self.is_target, unigram_gap)
        self.opening_steps = round(float(opening) * int(max_steps))  # max_steps 0: a phase after step 0
        self.feed_until = self.opening_steps - math.ceil(float((self.caps - self.floors).max()) / OPENING_MOVE)
        self.has_opening = bool(self.ease.any()) and self.feed_until >= 1
        self.fed = others_then_targets(
            self.floors + self.ease * (self.caps - self.floors), self.quiet, self.is_target, self.floors, self.caps
        )
        self.mix = (self.fed if self.has_opening else self.prior).copy()

    def observe(self, step: int, arm_losses: Mapping[str, float], mixture: Mapping[str, float] | None = None) -> None:
        self._observe_losses(step, arm_losses)
        nxt = int(step) + 1  # the mixture set here is the next step's
        opening = self.has_opening and nxt <= self.opening_steps
        gap = self.goal_for(nxt) - self.mix
        biggest = float(np.abs(gap).max())
        if biggest > 0:
            self.mix = self.mix + min(1.0, (OPENING_MOVE if opening else self.max_move) / biggest) * gap
        self._weights = None

    def goal_for(self, step: int) -> np.ndarray:
        """Where the mixture of `step` heads: the easy arms fed, or the goal from the evaluations."""
        if self.has_opening and step <= self.feed_until:
            return self.fed
        return self.goal

    def observe_eval(self, step: int, arm_losses: Mapping[str, float]) -> None:
        """One evaluation's validation loss per arm; one that lacks an arm, or has a non-finite loss, is not
        evidence (the supervisor logs only complete ones)."""
        losses = np.array([float(arm_losses.get(n, np.nan)) for n in self.arm_names])
        if not np.all(np.isfinite(losses)):
            return
        if self.evals and step <= self.evals[-1][0]:
            raise ValueError(f"observe_eval(step={step}) after the evaluation of step {self.evals[-1][0]}")
        self.evals.append((float(step), losses))
        if len(self.evals) < MIN_EVALS:
            return
        speed, error = self.speed()
        objective = float(speed[self.is_target].mean())
        if objective <= 0:  # the targets no longer improve: no evidence to move on
            return
        optimistic = speed + CONFIDENCE * error
        learning = np.clip(optimistic / (self.stall * objective) - 1.0, 0.0, 1.0)
        self.value = np.where(self.is_target, learning * self.quiet, 0.0)
        self.goal = allocate(self.value, self.is_target, self.floors, self.caps, self.explore)
        self._weights = None

    def speed(self) -> tuple[np.ndarray, np.ndarray]:
        """Each arm's validation-loss drop per step over the evaluations kept, and its standard error
        (zeros with fewer than MIN_EVALS)."""
        if len(self.evals) < MIN_EVALS:
            return np.zeros(self.k), np.zeros(self.k)
        steps = np.array([s for s, _v in self.evals])
        losses = np.array([v for _s, v in self.evals])
        fits = [slope_and_error(steps, losses[:, k]) for k in range(self.k)]
        return np.array([-b for b, _e in fits]), np.array([e for _b, e in fits])

    def _target(self) -> np.ndarray:
        return self.mix

    def _reward(self) -> np.ndarray:
        return self.value.copy()
