"""`build` turns names and string options into validated objects, or says exactly what is wrong."""

import dataclasses

import pytest

from dllm_decode.registry import build, coerce
from dllm_decode.schedulers import SCHEDULERS, ThresholdScheduler


def test_build_parses_options_into_field_types():
    obj = build(SCHEDULERS, "threshold", {"threshold": "0.75"})
    assert obj == ThresholdScheduler(threshold=0.75)


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match=r"unknown name 'nope'; choose from \[.*'threshold'"):
        build(SCHEDULERS, "nope", {})


def test_unknown_option_lists_the_fields():
    with pytest.raises(ValueError, match=r"unknown option 'tau'; valid: \['threshold'\]"):
        build(SCHEDULERS, "threshold", {"tau": "0.5"})


def test_instances_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ThresholdScheduler().threshold = 0.5


@pytest.mark.parametrize("annotation, text, expected", [
    (bool, "false", False), (bool, "1", True), (int, "3", 3), (float, "0.5", 0.5),
    (int | None, "none", None), (int | None, "4", 4), (tuple[int, ...], "1, 2,3", (1, 2, 3)),
])
def test_coerce(annotation, text, expected):
    assert coerce(annotation, text) == expected


def test_coerce_rejects_bad_booleans():
    with pytest.raises(ValueError, match="expected a boolean"):
        coerce(bool, "yes please")
