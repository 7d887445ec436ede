"""The bandit policies an experiment or a pivot may name: one model per policy, its parameters declared once.

`experiment.bandit` is one of the models below, picked by its `policy` key
(default DEFAULT_POLICY); `proxy/bandit/__init__.py` builds each policy from
its model, whose fields are the policy's keyword arguments. A parameter of
another policy is an error in an experiment file (it would silently do
nothing), except at that parameter's default: a run directory's frozen
experiment written before each policy had its own model holds every
policy's parameters at their defaults, and must load. docs/EXPERIMENTS.md,
"Bandit policies", describes each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Discriminator, Field, Tag, TypeAdapter

from .strict import TAG, StrictModel


class PolicyConfig(StrictModel):
    """What every policy has: its name, and the EMA of each arm's loss that `.state.json` shows (ucb1's
    reward baseline)."""

    policy: str
    ema_alpha: float = Field(default=0.1, gt=0, le=1)

    def params(self) -> dict[str, Any]:
        """The policy's keyword arguments (its bandit class's constructor takes them by these names)."""
        return self.model_dump(exclude={"policy"})


class UCB1Config(PolicyConfig):
    policy: Literal["ucb1"] = "ucb1"
    c: float = Field(default=1.0, ge=0)
    reward_scale: float = Field(default=1000.0, gt=0)
    temperature: float = Field(default=10.0, ge=0)


class EXP3Config(PolicyConfig):
    policy: Literal["exp3"] = "exp3"
    smoothing: float = Field(default=0.9, ge=0, lt=1)  # weight of the old estimate in the smoothed reward


class UniformConfig(PolicyConfig):
    policy: Literal["uniform"] = "uniform"


class ProgressConfig(PolicyConfig):
    """The EMA whose record lows it follows, the pulls its speed is fitted over, the spare mass spread
    evenly, the smoothing of its rewards."""

    policy: Literal["progress"] = "progress"
    window: int = Field(default=100, ge=3)
    explore: float = Field(default=0.05, ge=0, le=1)
    smoothing: float = Field(default=0.9, ge=0, lt=1)
    record_alpha: float = Field(default=0.05, gt=0, le=1)


class TargetConfig(PolicyConfig):
    """The evaluations its speeds are fitted over, the share of the objective's speed below which a target
    arm counts as stalled, the spare mass spread evenly, the most any arm's weight moves in one step."""

    policy: Literal["target"] = "target"
    eval_window: int = Field(default=10, ge=3)
    stall: float = Field(default=0.25, gt=0, le=1)
    explore: float = Field(default=0.05, ge=0, le=1)
    max_move: float = Field(default=0.006, gt=0, le=1)
    opening: float = Field(default=0.1, ge=0, le=0.5)  # the run's share that is the opening (0: none)


POLICY_MODELS: dict[str, type[PolicyConfig]] = {
    cls.model_fields["policy"].default: cls
    for cls in (UCB1Config, EXP3Config, UniformConfig, ProgressConfig, TargetConfig)
}
POLICIES = tuple(POLICY_MODELS)
DEFAULT_POLICY = "target"  # docs/DATA-MIXING.md: the one the suite shows best
POLICY_LIST = ", ".join(map(repr, POLICIES))


def _policy_of(value: Any) -> str | None:
    """The union's discriminator: a JSON object's `policy` (DEFAULT_POLICY when absent), or a model's."""
    if isinstance(value, PolicyConfig):
        return TAG + value.policy
    if isinstance(value, dict):
        policy = value.get("policy", DEFAULT_POLICY)
        return TAG + policy if isinstance(policy, str) and policy in POLICY_MODELS else None
    return None


def _own_params(value: Any) -> Any:
    """Before the union: the policy's name filled in, and a parameter of another policy dropped when at its
    default (module docstring), refused otherwise (every one named in the message)."""
    if not isinstance(value, dict):
        return value
    policy = value.get("policy", DEFAULT_POLICY)
    if not isinstance(policy, str) or policy not in POLICY_MODELS:
        raise ValueError(f"unknown policy {str(policy)[:40]!r} (the policies: {POLICY_LIST})")
    own = POLICY_MODELS[policy].model_fields
    out, stray = {"policy": policy}, []
    for key, v in value.items():
        if key in own:
            out[key] = v
            continue
        defaults = [cls.model_fields[key].default for cls in POLICY_MODELS.values() if key in cls.model_fields]
        if not defaults:
            out[key] = v  # no policy's: the model refuses it as an unknown key
        elif any(v != d for d in defaults):
            stray.append(str(key)[:40])
    if stray:
        verb = "does" if len(stray) == 1 else "do"
        raise ValueError(f"{', '.join(sorted(stray))} {verb} not apply to policy {policy!r}")
    return out


if TYPE_CHECKING:  # the type checker cannot read a Union built at run time: the same policies, spelled out
    BanditConfig = UCB1Config | EXP3Config | UniformConfig | ProgressConfig | TargetConfig
else:
    BanditConfig = Annotated[
        # A Union built from a tuple at run time: there is no `|` spelling of it.
        Union[tuple(Annotated[cls, Tag(TAG + name)] for name, cls in POLICY_MODELS.items())],  # noqa: UP007
        Discriminator(_policy_of, custom_error_type="policy", custom_error_message=f"the policies: {POLICY_LIST}"),
        BeforeValidator(_own_params),
    ]
_ADAPTER: TypeAdapter[BanditConfig] = TypeAdapter(BanditConfig)


def bandit_config(policy: str = DEFAULT_POLICY, **params: Any) -> PolicyConfig:
    """A policy's model from its name and parameters (pydantic's ValidationError when they are not valid)."""
    return _ADAPTER.validate_python({"policy": policy, **params})


def switched(config: PolicyConfig, policy: str) -> PolicyConfig:
    """`policy`'s model for a pivot from `config`: the parameters the two share keep their values (a pivot
    names the policy alone), the others their defaults."""
    if policy == config.policy:
        return config
    cls = POLICY_MODELS[policy]
    return cls(**{k: v for k, v in config.params().items() if k in cls.model_fields})
