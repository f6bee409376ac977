"""On-policy (DAgger) Learn2PD rounds: what the logger records, how it labels, when it stops."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.eval.training.filter import class_weights, collect, train_filter
from dllm_decode.eval.training.onpolicy import OnPolicyLogger, rollouts
from dllm_decode.eval.training.steps import StepData
from dllm_decode.filters.learned import LearnedFilter
from dllm_decode.filters.mlp import load_mlp
from dllm_decode.testing import OracleMaskPredictor, tiny_llada

TARGET = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])
# the step filter accepts confidence > 0.75: slots 0, 2, 4, 6
CONFIDENCE = torch.tensor([0.9, 0.5, 0.8, 0.6, 0.95, 0.3, 0.99, 0.2])


@pytest.fixture
def model():
    return OracleMaskPredictor(TARGET, CONFIDENCE, vocab_size=12, mask_token_id=11, eos_token_id=10)


def decode(model, reference, policy=None, beta=0.0):
    logger = OnPolicyLogger(reference=(tuple(reference),), policy=policy, beta=beta, width=8)
    result = generate(model, [[4, 5]], DecodeConfig(logger, gen_length=8, block_length=8))
    return logger.sink, result


def slots(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().flatten().tolist()


def test_policy_states_are_logged_with_the_reference_labels_until_the_block_ends(model, step_weights):
    policy = LearnedFilter(weights=step_weights(8), width=8)
    sink, result = decode(model, TARGET.tolist(), policy)
    # step 0 accepts 0, 2, 4, 6; then the top-1 alone: 3 (0.6), 1, 5, 7
    assert result.nfe.tolist() == [5] and torch.equal(result.tokens[0], TARGET)
    assert [slots(r["valid"][0]) for r in sink] == [list(range(8)), [1, 3, 5, 7], [1, 5, 7], [5, 7], [7]]
    assert all(bool(r["labels"][0][r["valid"][0]].all()) for r in sink)
    assert torch.allclose(sink[0]["features"][0], CONFIDENCE)          # what the filter saw
    assert torch.equal(sink[1]["features"][0][[0, 2, 4, 6]], torch.ones(4))   # settled slots
    assert [bool(r["first"][0]) for r in sink] == [True, False, False, False, False]
    assert not any(bool(r["wrong"][0]) for r in sink)


def test_logging_stops_at_the_first_wrong_commit_and_the_canvas_keeps_the_reference(model, step_weights):
    reference = TARGET.tolist()
    reference[4] = 9                                   # the model's confident slot 4 is wrong
    sink, result = decode(model, reference, LearnedFilter(weights=step_weights(8), width=8))
    assert len(sink) == 1                                # step 0 is logged, the rest of the block is not
    (record,) = sink
    assert slots(record["labels"][0]) == [0, 1, 2, 3, 5, 6, 7] and bool(record["wrong"][0])
    assert result.tokens[0].tolist() == reference        # resumed from the oracle state
    assert result.nfe.tolist() == [5]                    # the policy's own pace


def test_beta_one_is_the_oracle_logged_with_the_models_own_predictions(model):
    reference = TARGET.tolist()
    reference[4] = 9
    sink, result = decode(model, reference, beta=1.0)
    # step 0 commits the seven matching slots; step 1 stalls on slot 4 and writes the reference
    assert result.nfe.tolist() == [2] and result.tokens[0].tolist() == reference
    assert [slots(r["valid"][0]) for r in sink] == [list(range(8)), [4]]
    assert slots(sink[0]["labels"][0]) == [0, 1, 2, 3, 5, 6, 7]
    assert not bool(sink[1]["labels"][0][4])            # the stall is a negative, not a wrong commit
    assert all(bool(r["oracle"][0]) and not bool(r["wrong"][0]) for r in sink)


def test_rollouts_map_rows_to_prompts_and_report_the_round(model, step_weights):
    reference = TARGET.repeat(3, 1)
    reference[1, 4] = 9
    data, stats = rollouts(model, [[4, 5]] * 3, reference, policy=LearnedFilter(weights=step_weights(8), width=8),
                           beta=0.0, gen_length=8, block_length=8, width=8, eotp=False, batch_size=2)
    assert sorted(set(data.prompt.tolist())) == [0, 1, 2]
    assert (data.prompt == 1).sum() == 1 and (data.prompt == 0).sum() == (data.prompt == 2).sum() == 5
    assert stats["rows"] == 11 and stats["nfe_mean"] == 5.0 and stats["oracle_row_share"] == 0.0
    assert stats["blocks_cut_by_a_wrong_commit"] == pytest.approx(1 / 3)


def test_bad_beta_and_width_are_refused(step_weights):
    with pytest.raises(ValueError, match="beta must be in"):
        OnPolicyLogger(beta=1.5)
    with pytest.raises(ValueError, match="width"):
        OnPolicyLogger(policy=LearnedFilter(weights=step_weights(8), width=8), width=32)


def test_oracle_trajectory_has_negative_labels_too():
    # regression: the oracle writes reference tokens, and labels once compared those to the
    # reference (always equal); they must compare the model's predictions
    model = tiny_llada()
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]
    data, reference, _ = collect(model, prompts, gen_length=16, block_length=8, width=8, trajectory="oracle")
    assert (~data.labels & data.valid).any()
    baseline, _, _ = collect(model, prompts, gen_length=16, block_length=8, width=8, trajectory="baseline")
    assert (~baseline.labels & baseline.valid).any() and reference.shape == (3, 16)


def test_class_weights_give_each_class_half_the_valid_weight():
    labels = torch.tensor([[True, True, True, False], [True, False, True, True]])
    valid = torch.tensor([[True, True, True, True], [True, True, False, False]])
    data = StepData(torch.zeros(2, 4), labels, valid, torch.zeros(2, dtype=torch.long))
    w = class_weights(data)
    assert w[~valid].eq(0).all()
    assert torch.isclose(w[labels & valid].sum(), torch.tensor(3.0))      # 6 valid: 4 pos, 2 neg
    assert torch.isclose(w[~labels & valid].sum(), torch.tensor(3.0))


def test_train_filter_runs_dagger_rounds_with_a_decaying_expert_share(tmp_path):
    model = tiny_llada()
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 30, (4,), generator=generator).tolist() for _ in range(6)]
    out = tmp_path / "filter.safetensors"
    _, report = train_filter(model, prompts, gen_length=16, block_length=8, width=8, epochs=20,
                             heldout=0.34, trajectory="oracle", rounds=2, beta=0.5, balance=True,
                             out=str(out), save_rounds=True)
    assert [r["beta"] for r in report["round_reports"]] == [0.5, 0.25]
    assert all(r["rows"] > 0 and 1 <= r["nfe_mean"] <= 16 for r in report["round_reports"])
    assert report["steps"] > sum(r["rows"] for r in report["round_reports"])
    rounds = [LearnedFilter(weights=str(tmp_path / f"filter.round{r}.safetensors"), width=8) for r in range(3)]
    final = LearnedFilter(weights=str(out), width=8)
    assert torch.equal(load_mlp(rounds[2].weights).fc2.bias, load_mlp(final.weights).fc2.bias)
    assert not torch.equal(load_mlp(rounds[0].weights).fc2.bias, load_mlp(final.weights).fc2.bias)
    with pytest.raises(ValueError, match="rounds >= 0"):
        train_filter(model, prompts, rounds=-1)
