"""scripts/mixing/compare.py: a summary's mixes against another's, field by field, exactly."""

from __future__ import annotations

import copy
import json

import pytest
from mixing.compare import CompareError, compare_mixes, first_difference, read_mixes

MIX = {
    "experiment": "MIXING-GOOD",
    "seeds": [1, 2, 3],
    "policies": {
        "uniform": {"final_target_loss": {"mean": 5.0531, "per_seed": {"1": 5.1, "2": 5.0}}, "max_move": 0.0},
        "target": {"final_target_loss": {"mean": 4.8712, "per_seed": {"1": 4.9, "2": 4.8}}, "max_move": 0.0},
    },
    "target_curve": {"steps": [20, 40], "mean": [6.1, 5.9]},
}


def test_the_same_mix_is_identical():
    assert first_difference(MIX, copy.deepcopy(MIX)) is None
    assert compare_mixes({"good": MIX}, {"good": copy.deepcopy(MIX), "other": {}}) == [("good", None)]


@pytest.mark.parametrize(
    "change, found",
    [
        (
            lambda m: m["policies"]["target"]["final_target_loss"].update(mean=4.87121),
            "policies.target.final_target_loss.mean: 4.8712 here, 4.87121 there",
        ),
        (lambda m: m["target_curve"]["mean"].__setitem__(1, 5.8), "target_curve.mean[1]: 5.9 here, 5.8 there"),
        (lambda m: m["target_curve"]["steps"].append(60), "target_curve.steps: 2 items here, 3 there"),
        (lambda m: m["policies"]["uniform"].update(max_move=0), "policies.uniform.max_move: 0.0 here, 0 there"),
        (lambda m: m["policies"]["uniform"].update(max_move=-0.0), "policies.uniform.max_move: 0.0 here, -0.0 there"),
        (lambda m: m["policies"]["uniform"].pop("max_move"), "policies.uniform.max_move: only here"),
        (lambda m: m.update(extra=1), "extra: only there"),
        (lambda m: m.update(seeds=[1, 2, True]), "seeds[2]: 3 here, true there"),
    ],
)
def test_the_first_field_that_differs_is_named(change, found):
    theirs = copy.deepcopy(MIX)
    change(theirs)
    assert first_difference(MIX, theirs) == found


def test_the_first_difference_in_our_order():
    theirs = copy.deepcopy(MIX)
    theirs["seeds"] = [1, 2]
    theirs["target_curve"]["mean"] = [6.0, 5.9]
    assert first_difference(MIX, theirs) == "seeds: 3 items here, 2 there"


def test_a_mix_the_other_lacks_differs():
    assert compare_mixes({"good": MIX, "sizes": MIX}, {"good": MIX}) == [
        ("good", None),
        ("sizes", "not in the other summary"),
    ]


def test_read_mixes(tmp_path):
    good = tmp_path / "s.json"
    good.write_text(json.dumps({"mixes": {"good": MIX}, "how": {"wall_s": 1}}))
    assert read_mixes(good) == {"good": MIX}
    for text in ("not json", json.dumps({"no": "mixes"}), json.dumps({"mixes": [1]}), json.dumps([1])):
        good.write_text(text)
        with pytest.raises(CompareError, match="not a mixing summary"):
            read_mixes(good)
    with pytest.raises(CompareError, match="not a mixing summary"):
        read_mixes(tmp_path / "none.json")
