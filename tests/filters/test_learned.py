"""Learn2PD filter: accept rule, union/only composition, weight loading, and training."""

import dataclasses
import os

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.interfaces import Decision
from dllm_decode.registry import build
from dllm_decode.testing import OracleMaskPredictor, tiny_llada
from dllm_decode.eval.training.filter import StepData, collect, fit, metrics, train_filter
from dllm_decode.filters import FILTERS, LearnedFilter, load_mlp
from dllm_decode.filters.mlp import save_mlp
from dllm_decode.schedulers import LowConfidenceScheduler
from tests.filters.helpers import make_input, step_mlp

INF = float("inf")


def four_column_step():
    # column 3 is committed; the step network accepts confidences > 0.75
    return make_input([[0.9, 0.5, 0.8, -INF]], [[1, 2, 3, 4]], block=[[0, 4]])


@pytest.mark.parametrize("mode, expected", [("union", [True, True, True, False]),
                                            ("only", [True, False, True, False])])
def test_union_adds_accepted_positions_and_only_replaces(step_weights, mode, expected):
    inp = four_column_step()
    base = Decision(commit=torch.tensor([[False, True, False, False]]))
    out = LearnedFilter(weights=step_weights(4), width=4, mode=mode)(inp, base)
    assert out.commit.tolist() == [expected]


def test_accepts_only_eligible_columns_of_each_rows_block(step_weights):
    # window from column 4; row 0's block is [6, 8), row 1's is [4, 6): all confidences 0.9
    inp = make_input([[0.9] * 4, [0.9] * 4], [[1] * 4, [1] * 4], block=[[6, 8], [4, 6]], offset=4)
    out = LearnedFilter(weights=step_weights(4), width=4, mode="only")(
        inp, Decision(commit=torch.zeros(2, 4, dtype=torch.bool)))
    assert out.commit.tolist() == [[False, False, True, True], [True, True, False, False]]


def test_block_wider_than_filter_is_cropped(step_weights):
    inp = make_input([[0.9] * 4], [[1] * 4], block=[[0, 4]])
    out = LearnedFilter(weights=step_weights(2), width=2, mode="only")(
        inp, Decision(commit=torch.zeros(1, 4, dtype=torch.bool)))
    assert out.commit.tolist() == [[True, True, False, False]]


def test_scheduler_tokens_kept_where_it_committed(step_weights):
    inp = four_column_step()
    base = Decision(commit=torch.tensor([[True, False, False, False]]), tokens=torch.tensor([[7, 7, 7, 7]]))
    out = LearnedFilter(weights=step_weights(4), width=4)(inp, base)
    assert out.tokens.tolist() == [[7, 7, 3, 7]]       # column 2 accepted -> its candidate


def test_does_not_modify_inputs(step_weights):
    inp = four_column_step()
    snapshot = {f.name: getattr(inp, f.name).clone() for f in dataclasses.fields(inp)
                if isinstance(getattr(inp, f.name), torch.Tensor)}
    base = Decision(commit=torch.zeros(1, 4, dtype=torch.bool))
    LearnedFilter(weights=step_weights(4), width=4)(inp, base)
    assert not base.commit.any()
    for name, value in snapshot.items():
        assert torch.equal(getattr(inp, name), value), name


def test_shipped_filter_loads_by_default():
    learned = build(FILTERS, "learned", {})
    assert learned.weights == "embedded" and load_mlp("embedded").width == learned.width == 32


def test_missing_and_wrong_width_weights_are_one_line_errors(step_weights, tmp_path):
    with pytest.raises(ValueError, match="not found at") as missing:
        build(FILTERS, "learned", {"weights": str(tmp_path / "nope.safetensors")})
    with pytest.raises(ValueError, match="width 8, but width=32") as wrong:
        build(FILTERS, "learned", {"weights": step_weights(8)})
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a ConfidenceMLP file") as bad:
        LearnedFilter(weights=str(corrupt))
    for err in (missing, wrong, bad):
        assert "\n" not in str(err.value)


def test_bad_fields_are_rejected(step_weights):
    with pytest.raises(ValueError, match="mode must be one of"):
        LearnedFilter(weights=step_weights(4), width=4, mode="both")
    with pytest.raises(ValueError, match=r"threshold must be in \[0, 1\], got 1.5"):
        LearnedFilter(weights=step_weights(4), width=4, threshold=1.5)


def test_weights_load_once_per_file_and_reload_when_rewritten(step_weights):
    path = step_weights(4)
    first = load_mlp(path)
    assert load_mlp(path) is first
    changed = step_mlp(4)
    with torch.no_grad():
        changed.fc2.bias.fill_(3.0)
    save_mlp(changed, path)
    os.utime(path, ns=(1, 1))                  # a different modification time, whatever the clock
    assert torch.equal(load_mlp(path).fc2.bias, torch.full((4,), 3.0))


def test_training_learns_a_synthetic_rule():
    # label: slot i is final when its confidence plus a quarter of its right neighbour's exceeds 0.9
    generator = torch.Generator().manual_seed(0)
    features = torch.rand(1200, 8, generator=generator)
    neighbour = torch.cat([features[:, 1:], torch.zeros(1200, 1)], 1)
    labels = features + 0.25 * neighbour > 0.9
    data = StepData(features, labels, torch.ones_like(labels), torch.zeros(1200, dtype=torch.long))
    train, test = data.take(torch.arange(1000)), data.take(torch.arange(1000, 1200))
    module = fit(train, width=8, epochs=150, lr=3e-2)
    report = metrics(module, test, threshold=0.5)
    majority = max(report["base_rate"], 1 - report["base_rate"])
    assert report["accuracy"] > majority + 0.15 and report["accuracy"] > 0.9


def test_train_filter_end_to_end_on_tiny_model(tmp_path):
    model = tiny_llada()
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 30, (4,), generator=generator).tolist() for _ in range(6)]
    out = tmp_path / "filter.safetensors"
    _, report = train_filter(model, prompts, gen_length=16, block_length=8, width=8, epochs=20,
                             heldout=0.34, trajectory="both", out=str(out))
    assert report["train_prompts"] + report["heldout_prompts"] == 6
    assert report["steps"] > 0 and 0 <= report["heldout"]["false_positive_rate"] <= 1
    assert 1 <= report["heldout_decode"]["oracle_nfe_mean"] <= 16
    learned = LearnedFilter(weights=str(out), width=8, threshold=0.5)
    config = DecodeConfig(LowConfidenceScheduler(), gen_length=16, block_length=8)
    result = generate(model, prompts[:2], dataclasses.replace(config, filters=[learned]))
    assert not (result.tokens == model.mask_token_id).any()


def test_oracle_trajectory_labels_match_its_commits():
    # along the oracle's path every committed slot was a correct prediction (or a stall pick)
    model = tiny_llada()
    prompts = [[3, 4, 5], [6, 7]]
    data, reference, _ = collect(model, prompts, gen_length=8, block_length=8, width=8, trajectory="oracle")
    assert reference.shape == (2, 8)
    assert data.features.shape[0] >= 2 and (data.labels & data.valid).any(-1).float().mean() > 0
    with pytest.raises(ValueError, match="trajectory must be one of"):
        collect(model, prompts, gen_length=8, block_length=8, width=8, trajectory="teacher")


@pytest.mark.parametrize("mode", ["union", "only"])
def test_oracle_end_to_end_commits_the_accepted_then_one_per_step(step_weights, mode):
    # accepted (> 0.75): columns 0, 2, 4, 6 at step 0; then 3, 1, 5, 7 one per step -> 5 NFE
    target = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])
    confidence = torch.tensor([0.9, 0.5, 0.8, 0.6, 0.95, 0.3, 0.99, 0.2])
    model = OracleMaskPredictor(target, confidence, vocab_size=12, mask_token_id=11, eos_token_id=10)
    config = DecodeConfig(LowConfidenceScheduler(), gen_length=8, block_length=8)
    result = generate(model, [[4, 5]], dataclasses.replace(config, filters=[LearnedFilter(weights=step_weights(8), width=8, mode=mode)]), trace=True)
    assert torch.equal(result.tokens[0], target) and result.nfe.tolist() == [5]
    assert result.trace[0]["commit"][0].nonzero().flatten().tolist() == [0, 2, 4, 6]
    assert generate(model, [[4, 5]], config).nfe.tolist() == [8]


@pytest.mark.slow
def test_compare_table_has_every_configuration(step_weights):
    from dllm_decode.testing import tiny_llada_with_tokenizer
    from dllm_decode.eval.training.filter import compare

    table = compare(tiny_llada_with_tokenizer(), per_task=1, gen_length=32, weights=step_weights(32))
    assert set(table) == {"low_confidence", "threshold_0.9", "learned", "learned+eotp",
                          "learned+eotp+dual", "learned+eotp_predicted", "oracle"}
    assert table["oracle"]["nfe"] <= table["low_confidence"]["nfe"]
    assert all(1 <= row["nfe"] <= 32 for row in table.values())
