"""The compact runtime of the diffusion models (`models/compact.py`) against the reference blocks.

Every case runs the same model object twice, `runtime="reference"` then `"compact"`, so the two
see identical weights. float32: equal to float rounding. bfloat16: the compact logits are as close
to the float32 reference as the bfloat16 reference itself is (folding a norm scale into a bf16
matrix rounds differently, not worse).
"""

from __future__ import annotations

import pytest
import torch

from dllm_decode.models import KVCache, compact, load_model
from dllm_decode.models.compact import DLLM_RUNTIMES, compact_problem, compact_stack, set_runtime
from dllm_decode.models.layers import RUNTIME_STATE
from dllm_decode.models.checkpoint import ModelLoadError
from dllm_decode.testing import assert_decodes_agree, assert_logits_close, tiny_block_diffusion
from tests.models.conftest import LENGTH, left_padded_batch, make_dream, make_llada


MODELS = {
    "llada": lambda: make_llada(),
    "llada_gqa": lambda: make_llada(n_kv_heads=2, include_qkv_bias=True),
    "dream": lambda: make_dream(),
    "fast_dllm": lambda: tiny_block_diffusion("fast_dllm", block_size=4),   # block-causal, shift
    "sdar": lambda: tiny_block_diffusion("sdar", block_size=4),             # q/k norms, head_dim 12
}


def run(model, runtime: str, ids, mask, **kwargs) -> torch.Tensor:
    set_runtime(model, runtime)
    with torch.inference_mode():
        return model(ids, attention_mask=mask, **kwargs)


def cached_steps(model, runtime: str, ids, mask, rows: tuple[int, int],
                 refresh: tuple[int, int] | None = None) -> tuple[torch.Tensor, ...]:
    """A refresh (filling the cache; logits of rows `refresh`, default all), then a cached step
    over `rows` after new tokens there. The stored K/V are zeroed at padding: no query attends
    those columns, and what a runtime stores there is its own (the compact one, on the CPU,
    skips padding's projections)."""
    kv = KVCache()
    full = run(model, runtime, ids, mask, kv=kv, rows=refresh or (0, ids.shape[1]))
    edited = ids.clone()
    edited[:, rows[0]:rows[1]] = torch.arange(rows[1] - rows[0]) % 7
    step = run(model, runtime, edited, mask, kv=kv, rows=rows)
    real = 1 if mask is None else mask[:, None, :, None]
    return full, step, kv.keys[-1] * real, kv.values[-1] * real


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("padded", [False, True])
def test_float32_logits_equal_reference(name, padded):
    model = MODELS[name]()
    ids, mask = left_padded_batch((LENGTH, 7))
    mask = mask if padded else None
    for rows in [None, (3, 8)]:
        kwargs = {} if rows is None else {"rows": rows}
        assert_logits_close(run(model, "compact", ids, mask, **kwargs),
                                   run(model, "reference", ids, mask, **kwargs))
    for refresh in [(0, LENGTH), (4, LENGTH)]:     # a refresh asked for every row, or the rest
        reference = cached_steps(model, "reference", ids, mask, (4, 8), refresh)
        compact = cached_steps(model, "compact", ids, mask, (4, 8), refresh)
        for ours, theirs in zip(compact, reference):     # refresh logits, cached step, stored K/V
            assert_logits_close(ours, theirs)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bfloat16_error_is_the_reference_rounding(name):
    model = MODELS[name]()
    ids, mask = left_padded_batch((LENGTH, 7))
    exact = cached_steps(model, "reference", ids, mask, (4, 8))[:2]
    model = model.to(torch.bfloat16)
    reference = cached_steps(model, "reference", ids, mask, (4, 8))[:2]
    compact = cached_steps(model, "compact", ids, mask, (4, 8))[:2]
    for ours, theirs, truth in zip(compact, reference, exact):
        assert ours.dtype == torch.float32 and ours.isfinite().all()
        rounding = (theirs - truth).abs().max()
        assert (ours - truth).abs().max() <= 2 * rounding + 1e-3 * truth.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_weights_keep_the_fast_layout_of_their_dtype(dtype):
    from dllm_decode.models.compact import transposed

    weight, scale = torch.randn(6, 4).to(dtype), torch.rand(4).to(dtype) + 0.5
    w = transposed(weight, scale)
    assert w.shape == (4, 6)
    torch.testing.assert_close(w, (weight * scale).t())
    # float32: row-major (in, out); half precisions keep the (out, in) rows (5x faster on CPU)
    assert w.is_contiguous() == (dtype == torch.float32)
    assert w.t().is_contiguous() == (dtype != torch.float32)


@pytest.mark.parametrize("name", ["llada", "fast_dllm"])
def test_padding_costs_no_token_wise_work_and_reads_zero(monkeypatch, name):
    """On the CPU the compact runtime projects only a left-padded batch's real columns (each of a
    block's four products sees exactly their count); the hidden state at padding is zero in both
    runtimes, so their logits agree there too, and real columns agree with a row run alone."""
    model = MODELS[name]()
    ids, mask = left_padded_batch((LENGTH, 7))
    seen, real_project = [], compact.project
    monkeypatch.setattr(compact, "project", lambda x, *rest: seen.append(x.shape[0]) or real_project(x, *rest))
    ours = run(model, "compact", ids, mask)
    assert seen and set(seen) == {int(mask.sum())}
    assert_logits_close(ours, run(model, "reference", ids, mask))
    hidden, _, _ = model.hidden_states(ids, mask, None, None, None)
    assert not hidden[mask == 0].any()
    alone = run(model, "compact", ids[1:, LENGTH - 7:], None)     # the short row without padding
    assert_logits_close(ours[1:, LENGTH - 7 + int(name == "fast_dllm"):], alone[:, int(name == "fast_dllm"):])


def test_embedded_model_matches_on_a_batch_with_a_cache():
    model = load_model("embedded")
    from dllm_decode.prompts import encode_prompts, left_pad

    ids = encode_prompts(["sort : mia ella hank", "copy : lucy eric kevin ian sam"], model.tokenizer)
    canvas, mask = left_pad(ids, 64, model.mask_token_id, model.eos_token_ids[0], torch.device("cpu"))
    start = canvas.shape[1] - 64
    reference = cached_steps(model, "reference", canvas, mask, (start, start + 32))
    compact = cached_steps(model, "compact", canvas, mask, (start, start + 32))
    for ours, theirs in zip(compact, reference):
        assert_logits_close(ours, theirs)


@pytest.mark.parametrize("cache", ["none", "dual", "prefix"])
def test_greedy_decode_is_identical(cache):
    from dllm_decode import DecodeConfig, generate

    model = load_model("embedded")
    prompts = ["sort : mia ella hank", "reverse : lucy eric kevin", "copy : sam ian"]
    config = DecodeConfig.from_dict({"scheduler": {"name": "threshold", "threshold": 0.9},
                                     "cache": cache, "gen_length": 64, "block_length": 32})
    results = {}
    for runtime in DLLM_RUNTIMES:
        set_runtime(model, runtime)
        results[runtime] = generate(model, prompts, config)
    assert_decodes_agree(results["compact"], results["reference"])   # two runtimes: a near tie may move a row


def test_block_diffusion_decode_is_identical_under_the_block_cache():
    from dllm_decode import DecodeConfig, generate

    model = load_model("embedded-bd")
    config = DecodeConfig.from_dict({"scheduler": {"name": "threshold", "threshold": 0.9},
                                     "cache": "block", "gen_length": 32,
                                     "block_length": model.block_size})
    texts = {}
    for runtime in DLLM_RUNTIMES:
        set_runtime(model, runtime)
        texts[runtime] = generate(model, ["sort : mia ella hank", "copy : sam ian"], config).text
    assert texts["compact"] == texts["reference"]


def test_training_keeps_the_reference_forward_and_weights_are_refused_stale():
    """Under autograd the compact copies (detached) are not used; after an in-place update the
    compact runtime rebuilds its fused weights."""
    model = set_runtime(make_llada(), "compact")
    ids, _ = left_padded_batch()
    loss = model(ids).logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05)
    assert_logits_close(run(model, "compact", ids, None), run(model, "reference", ids, None))


def test_unknown_and_unsupported_runtimes_are_refused():
    with pytest.raises(ValueError, match="runtime must be one of"):
        set_runtime(make_llada(), "fast")
    llada2 = tiny_block_diffusion("llada2")
    assert compact_problem(llada2) is not None
    with pytest.raises(ValueError, match="does not cover"):
        set_runtime(llada2, "compact")
    assert set_runtime(llada2, "reference") is llada2


def test_load_model_takes_the_runtime():
    assert load_model("embedded", runtime="compact").runtime == "compact"
    assert load_model("embedded", runtime="reference").runtime == "reference"
    with pytest.raises(ModelLoadError, match="runtime must be one of"):
        load_model("embedded", runtime="fast")


def test_compact_is_the_default_where_it_covers_the_model(tmp_path):
    assert load_model("embedded").runtime == "compact"
    tiny_block_diffusion("llada2").save_pretrained(tmp_path)      # MoE, partial rotary
    assert load_model(tmp_path).runtime == "reference"


def test_compact_holds_no_second_copy_of_the_weights():
    """The fused matrices are the modules' own weights: the storages behind the parameters and the
    compact blocks add up to the parameters' bytes, before and after a compact forward."""
    model = set_runtime(make_llada(n_kv_heads=2, include_qkv_bias=True), "compact")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    ids, mask = left_padded_batch()
    compact = run(model, "compact", ids, mask)
    blocks = compact_stack(model).blocks
    tensors = [*model.parameters(), *(t for b in blocks for t in vars(b).values() if torch.is_tensor(t))]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    assert sum(storages.values()) == weights
    assert_logits_close(compact, run(model, "reference", ids, mask))


def test_shared_weights_follow_a_state_load_and_a_dtype_change():
    model, other = make_llada(include_qkv_bias=True), make_llada(include_qkv_bias=True)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in other.parameters():
            p.normal_(0.0, 0.1)
    ids, mask = left_padded_batch()
    run(model, "compact", ids, mask)                       # the weights are views now
    model.load_state_dict(other.state_dict())
    assert_logits_close(run(model, "compact", ids, mask), run(other, "reference", ids, mask))
    model.to(torch.bfloat16)                               # the fp32 stack is let go at once
    assert RUNTIME_STATE not in model.__dict__
    halved = run(model, "compact", ids, mask)
    assert compact_stack(model).blocks[0].qkv.dtype == torch.bfloat16
    torch.testing.assert_close(halved, run(model, "reference", ids, mask), atol=0.05, rtol=0.02)


def test_replaced_parameters_and_untracked_updates_reach_the_compact_forward():
    """Found in review: a stack keyed to the Parameter objects it was built from ran stale weights
    after `load_state_dict(assign=True)`, and a copied q/k norm scale missed updates that bump
    no version counter (fused AdamW; `.data` writes)."""
    ids, mask = left_padded_batch()
    model, other = make_llada(), make_llada()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1 * torch.randn_like(p))
    run(model, "compact", ids, mask)
    model.load_state_dict({k: v.clone() for k, v in other.state_dict().items()}, assign=True)
    assert_logits_close(run(model, "compact", ids, mask), run(other, "reference", ids, mask))
    sdar = set_runtime(tiny_block_diffusion("sdar", block_size=4), "compact")
    run(sdar, "compact", ids, mask)
    q_norm, _ = sdar.parts()[1][0].qk_norms()
    q_norm.weight.data.mul_(3)                             # no version bump
    assert_logits_close(run(sdar, "compact", ids, mask), run(sdar, "reference", ids, mask))


def test_swapped_modules_and_parameter_table_writes_reach_the_compact_forward():
    """The compact runtime keeps its list of the model's modules between forwards while their
    children are the same; a module swapped by assignment, and a parameter written straight into
    a module's table, still reach the next forward (the model stays compact throughout: `run`
    would switch it)."""
    import copy

    ids, mask = left_padded_batch()
    model, other = set_runtime(make_llada(), "compact"), make_llada()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1 * torch.randn_like(p))

    def forward(m):
        with torch.inference_mode():
            return m(ids, attention_mask=mask)

    def reference(m):
        return run(copy.deepcopy(m), "reference", ids, mask)

    forward(model)
    ours, theirs = model.parts()[1][0], other.parts()[1][0]
    for name, child in theirs.named_children():            # module assignment: a registration
        setattr(ours, name, copy.deepcopy(child))
    assert_logits_close(forward(model), reference(model))
    block = model.parts()[1][1]
    linear = next(m for m in block.modules() if isinstance(m, torch.nn.Linear))
    linear._parameters["weight"] = torch.nn.Parameter(linear.weight.detach() * 2)   # no hook
    assert_logits_close(forward(model), reference(model))


def test_a_model_loaded_under_inference_mode_runs_compact():
    from dllm_decode import DecodeConfig, generate

    config = DecodeConfig.from_dict({"scheduler": "threshold", "gen_length": 16, "block_length": 16})
    with torch.inference_mode():
        model = load_model("embedded")
        inside = generate(model, ["sort : mia ella hank"], config).text
    assert model.runtime == "compact"
    assert generate(model, ["sort : mia ella hank"], config).text == inside
    assert generate(set_runtime(model, "reference"), ["sort : mia ella hank"], config).text == inside


def test_copies_do_not_carry_the_compact_stack():
    import copy
    import pickle

    model = set_runtime(make_llada(), "compact")
    ids, mask = left_padded_batch()
    before = run(model, "compact", ids, mask)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert RUNTIME_STATE not in twin.__dict__
        assert_logits_close(run(twin, "compact", ids, mask), before)


def test_a_model_run_compact_saves_and_reloads(tmp_path):
    model = set_runtime(make_llada(include_qkv_bias=True), "compact")
    ids, mask = left_padded_batch()
    before = run(model, "compact", ids, mask)
    model.save_pretrained(tmp_path)                  # the shared views are written as own tensors
    assert_logits_close(run(load_model(tmp_path), "compact", ids, mask), before)


def test_cli_runtime_option():
    from click.testing import CliRunner

    from dllm_decode.cli import main

    runner = CliRunner()
    ok = runner.invoke(main, ["--runtime", "compact", "--model", "tiny", "--prompt", "a b",
                              "--gen-length", "8"])
    assert ok.exit_code == 0, ok.output
    refused = runner.invoke(main, ["--runtime", "compact", "--model", "ideal", "--prompt", "a b"])
    assert refused.exit_code == 2 and "does not cover" in refused.output


@pytest.mark.parametrize("make", [make_llada, make_dream], ids=["llada", "dream"])
def test_checkpoint_loaded_compact_matches_the_reference(tmp_path, make):
    make().save_pretrained(tmp_path)
    reference = load_model(tmp_path, runtime="reference")
    compact = load_model(tmp_path, runtime="compact")
    ids, mask = left_padded_batch((LENGTH, 6))
    with torch.inference_mode():
        assert_logits_close(compact(ids, attention_mask=mask),
                                   reference(ids, attention_mask=mask))
