"""The bandit policies an experiment or a pivot may name, and the parameters each one uses.

A parameter of a policy other than the chosen one is an error in an
experiment file (it would silently do nothing). docs/EXPERIMENTS.md,
"Bandit policies", describes each.
"""
from __future__ import annotations

POLICY_PARAMS = {
    "ucb1": frozenset({"c", "ema_alpha", "reward_scale", "temperature"}),
    "exp3": frozenset({"ema_alpha", "smoothing"}),
    "uniform": frozenset({"ema_alpha"}),
    "progress": frozenset({"ema_alpha", "window", "explore", "smoothing", "record_alpha"}),
    "target": frozenset({"ema_alpha", "eval_window", "stall", "explore", "max_move"}),
}
DEFAULT_POLICY = "target"  # docs/DATA-MIXING.md: the one the suite shows best
POLICIES = tuple(POLICY_PARAMS)
