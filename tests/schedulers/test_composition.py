"""Wrappers compose through the interface and are configurable from the CLI with dotted options."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.config import DecodeConfig
from dllm_decode.registry import build, component, component_dict
from dllm_decode.schedulers import (SCHEDULERS, AdaptiveBlockScheduler, CreditScheduler, EarlyCommitScheduler,
                        KLASSScheduler, LocalLeapScheduler, ThresholdScheduler)
from dllm_decode.schedulers.columns import carry

def test_dotted_options_configure_the_base():
    built = build(SCHEDULERS, "early_commit", {"base": "local_leap", "base.kappa": "0.8"})
    assert built == EarlyCommitScheduler(base=LocalLeapScheduler(kappa=0.8))


def test_dotted_options_on_a_default_base_keep_its_other_settings():
    assert build(SCHEDULERS, "credit", {"base.threshold": "0.7"}).base == ThresholdScheduler(0.7)
    deep = build(SCHEDULERS, "early_commit", {"base": "credit", "base.base": "local_leap",
                                              "base.base.radius": "2", "base.alpha": "0.5"})
    assert deep == EarlyCommitScheduler(base=CreditScheduler(base=LocalLeapScheduler(radius=2), alpha=0.5))


def test_nested_components_round_trip_through_json():
    nested = AdaptiveBlockScheduler(base=CreditScheduler(base=KLASSScheduler(history=3)), delimiter_ids=(4, 5))
    described = json.loads(json.dumps(component_dict(nested)))
    assert component("scheduler", described) == nested
    config = DecodeConfig(scheduler=nested, gen_length=16, block_length=5)
    assert DecodeConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_wrappers_take_block_bounds_and_view_from_their_base():
    stacked = CreditScheduler(base=AdaptiveBlockScheduler())
    assert stacked.chooses_block_bounds and stacked.view == "rest"
    assert not CreditScheduler().chooses_block_bounds and CreditScheduler().view == "block"
    assert EarlyCommitScheduler(base=ThresholdScheduler()).view == "rest"


def test_nested_option_errors_name_the_component():
    with pytest.raises(ValueError, match=r"local_leap: unknown option 'kapa'"):
        build(SCHEDULERS, "early_commit", {"base": "local_leap", "base.kapa": "0.8"})
    with pytest.raises(ValueError, match=r"tau must be in \(0, kappa=0.9\], got 0.95"):
        build(SCHEDULERS, "credit", {"base": "local_leap", "base.tau": "0.95"})


def cli(*args):
    base = ["--model", "tiny", "--gen-length", "8", "--block-length", "4", "--prompt", "w1 w2", "--json"]
    return CliRunner().invoke(main, [*base, *args])


def test_cli_composes_wrappers_with_dotted_options():
    result = cli("--scheduler", "early_commit", "-o", "base=local_leap", "-o", "base.kappa=0.8")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["config"]["scheduler"]["base"] == {"name": "local_leap", "kappa": 0.8,
                                                              "tau": 0.75, "radius": 4}


def test_cli_keeps_explicit_delimiters_and_decodes_uneven_blocks():
    result = cli("--scheduler", "adaptive_block", "-o", "delimiter_ids=3,6", "--gen-length", "10")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["config"]["scheduler"]["delimiter_ids"] == [3, 6]


def test_carry_realigns_by_canvas_column():
    values = torch.tensor([[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]])     # columns 5.. and 7..
    start = torch.tensor([5, 7])
    wanted = torch.tensor([[6, 7, 8], [6, 7, 10]])
    assert carry(values, start, wanted, -1.0).tolist() == [[11.0, 12.0, -1.0], [-1.0, 20.0, -1.0]]
    assert carry(values[:, :0], start, wanted, 0.0).shape == (2, 3)
