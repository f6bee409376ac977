"""SparseD, the sparse attention back end (`dllm_decode.models.sparsed`): its degenerate settings
equal dense attention, the tile choice on hand-made scores, padding, one build per request, the
paper's defaults, and the one-line refusals."""

from __future__ import annotations

import copy

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.interfaces import NoCache
from dllm_decode.models import sparsed
from dllm_decode.models.attention import set_attention
from dllm_decode.models.compact import set_runtime
from dllm_decode.models.sparsed import SparseD, choose_tiles, top_tiles
from dllm_decode.registry import component
from dllm_decode.sampler import generate
from dllm_decode.testing import assert_logits_close, tiny_block_diffusion, tiny_llada

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [4, 5, 6]]


def model_with(spec, runtime="compact", seed=3):
    model = set_runtime(tiny_llada(seed=seed), runtime)
    return set_attention(model, spec)


def config(scheduler="low_confidence", **fields):
    return DecodeConfig(scheduler=component("scheduler", scheduler), gen_length=8, block_length=4, **fields)


def sparse_forwards(model, canvas, mask, steps):
    """Logits of `steps` forwards through the `none` cache's state, one [MASK] committed between
    them (so each forward counts), beside the same model's dense logits."""
    cache, state = NoCache(), NoCache().init_state(model)
    dense = copy.deepcopy(model)
    dense.attention_backend = None
    out = []
    canvas = canvas.clone()
    for _ in range(steps):
        logits, _, state = cache.logits(model, canvas, mask, (0, canvas.shape[1]), 0, state)
        out.append((logits, dense(canvas, mask, rows=(0, canvas.shape[1])), state.any_sparse))
        column = int((canvas[0] == model.mask_token_id).nonzero()[0])
        canvas[:, column] = 7
    return out


def padded_canvas(model):
    mask_id = model.mask_token_id
    canvas = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9] + [mask_id] * 8,
                           [0] * 6 + [4, 5, 6] + [mask_id] * 8])
    attention = torch.ones_like(canvas)
    attention[1, :6] = 0
    return canvas, attention


@pytest.mark.parametrize("runtime", ["compact", "reference"])
def test_keeping_every_tile_equals_dense_attention(runtime):
    model = model_with({"name": "sparsed", "select": 1.0, "skip": 0.0, "tile": 2}, runtime)
    canvas, mask = padded_canvas(model)
    forwards = sparse_forwards(model, canvas, mask, 5)
    assert [sparse for _, _, sparse in forwards] == [False, False, True, True, True]
    for logits, dense, _ in forwards:
        assert_logits_close(logits[mask.bool()], dense[mask.bool()])


def test_a_real_selection_changes_the_logits_at_sparse_steps_only():
    model = model_with({"name": "sparsed", "select": 0.0, "skip": 0.0, "tile": 2})
    canvas, mask = padded_canvas(model)
    forwards = sparse_forwards(model, canvas, mask, 4)
    for logits, dense, sparse in forwards:
        differs = not torch.allclose(logits[mask.bool()], dense[mask.bool()], atol=1e-3)
        assert differs == sparse


def test_skip_one_is_dense_throughout_token_identical():
    dense = generate(tiny_llada(seed=3), PROMPTS, config())
    sparse = generate(model_with({"name": "sparsed", "skip": 1.0, "tile": 2, "select": 0.0}), PROMPTS, config())
    assert torch.equal(dense.tokens, sparse.tokens)
    # the same with a real switch step moves tokens (the setting above is not a no-op by accident)
    moved = generate(model_with({"name": "sparsed", "skip": 0.0, "tile": 2, "select": 0.0}), PROMPTS, config())
    assert not torch.equal(dense.tokens, moved.tokens)


def test_sparse_tokens_agree_across_runtimes():
    spec = {"name": "sparsed", "skip": 0.0, "tile": 2, "select": 0.3}
    compact = generate(model_with(spec, "compact"), PROMPTS, config())
    reference = generate(model_with(spec, "reference"), PROMPTS, config())
    assert torch.equal(compact.tokens, reference.tokens)


def test_top_tiles_keeps_the_dominant_tile_and_the_papers_count():
    score = torch.zeros(1, 1, 3, 5)
    score[0, 0, 0, 4] = score[0, 0, 1, 2] = score[0, 0, 2, 0] = 1.0
    valid = torch.ones(1, 5, dtype=torch.bool)
    kept = top_tiles(score, valid, select=0.0)                    # int(5 * 0) + 1 = 1 per row
    assert kept[0, 0].nonzero().tolist() == [[0, 4], [1, 2], [2, 0]]
    kept = top_tiles(score, valid, select=0.3)                    # int(1.5) + 1 = 2: ties to the lower tile
    assert kept[0, 0].sum(-1).tolist() == [2, 2, 2]
    assert kept[0, 0, 0].tolist() == [True, False, False, False, True]
    assert top_tiles(score, valid, select=1.0).all()              # int(5) + 1 = 6, capped at 5
    fewer = torch.tensor([[True, True, True, False, False]])     # a row with 3 real tiles
    assert top_tiles(score, fewer, select=1.0)[0, 0].sum(-1).tolist() == [3, 3, 3]


def test_padding_never_changes_a_rows_tiles():
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 11, 4), torch.randn(1, 2, 11, 4)
    tile = 3
    plain = choose_tiles(q, k, torch.ones(1, 11, dtype=torch.bool),
                         torch.tensor([5]), tile, 0.3, 0.5, 4)
    pad = 4
    qp = torch.cat([torch.randn(1, 2, pad, 4) * 50, q], 2)        # loud padding: would win if attended
    kp = torch.cat([torch.randn(1, 2, pad, 4) * 50, k], 2)
    real = torch.tensor([[False] * pad + [True] * 11])
    padded = choose_tiles(qp, kp, real, torch.tensor([5]), tile, 0.3, 0.5, 5)
    assert torch.equal(padded[..., :4, :4], plain) and not padded[..., 4].any()


def test_the_isolated_pass_keeps_a_generation_tile_for_every_query_tile():
    torch.manual_seed(1)
    q, k = torch.randn(1, 2, 12, 4), torch.randn(1, 2, 12, 4)
    kept = choose_tiles(q, k, torch.ones(1, 12, dtype=torch.bool), torch.tensor([6]), 3, 0.0, 0.5, 4)
    # prompt 6 tokens = tiles 0, 1; generation tiles 2, 3. The first pass keeps 1 of the 4 tiles
    # and loses it when it is a generation tile; the isolated pass keeps 1 of the 2 generation tiles
    assert kept[..., :2].sum(-1).le(1).all() and kept[..., 2:].sum(-1).eq(1).all()
    assert kept[..., :2].any()                          # (some query tile's first pick was the prompt)


def test_the_pattern_is_built_once_per_request_at_its_switch_step(monkeypatch):
    calls = []

    def counted(q, k, *args, **kwargs):
        calls.append(q.shape[0])
        return choose_tiles(q, k, *args, **kwargs)

    monkeypatch.setattr(sparsed, "choose_tiles", counted)
    model = model_with({"name": "sparsed", "skip": 0.25, "tile": 2})   # T = 8: E = 3
    steps = []
    original = sparsed.SparseState.begin

    def begin(self, canvas, mask):
        original(self, canvas, mask)
        steps.append((self.step.tolist(), self.building.tolist()))

    monkeypatch.setattr(sparsed.SparseState, "begin", begin)
    result = generate(model, PROMPTS, config())
    assert calls == [2, 2]                     # one build of both rows, once per layer (2 layers)
    assert [s for s, b in steps if any(b)] == [[3, 3]]
    assert int(result.nfe.max()) == 8 and len(steps) == 8


def test_the_papers_defaults():
    options = SparseD()
    assert (options.skip, options.select, options.tile, options.steps, options.scale) == \
        (0.2, 0.3, 128, 0, "head_dim")
    # E = int(T * skip) + 1 with T the generation length (128 in the reference's defaults)
    state = options.new_state(tiny_llada())
    canvas = torch.tensor([[1, 2] + [36] * 128])
    for _ in range(27):
        state.begin(canvas, None)
        canvas[0, 2 + int(state.step)] = 5
    assert int(state.step) == 26 and state.any_building and not state.any_sparse   # int(25.6) + 1
    state.begin(canvas, None)
    assert int(state.builds) == 1 and not state.any_building and state.any_sparse


@pytest.mark.parametrize("spec, words", [
    ({"name": "sparsed", "tile": 0}, "tile must be >= 1"),
    ({"name": "sparsed", "select": 1.5}, "select must be in [0, 1]"),
    ({"name": "sparsed", "skip": -0.1}, "skip"),
    ({"name": "sparsed", "scale": "d"}, "scale must be one of"),
    ({"name": "flash"}, "unknown attention 'flash'"),
])
def test_bad_options_are_one_line(spec, words):
    with pytest.raises(ValueError) as caught:
        set_attention(tiny_llada(), spec)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_other_families_and_caches_are_refused_in_one_line():
    with pytest.raises(ValueError, match="block-causal"):
        set_attention(tiny_block_diffusion("sdar"), "sparsed")
    model = model_with("sparsed")
    for cache in ("prefix", "dual", "d2"):
        with pytest.raises(ValueError, match=f"runs only under the caches \\['none'\\], not '{cache}'"):
            generate(model, PROMPTS, config(cache=component("cache", cache)))
    set_attention(model, "dense")                      # back to dense: every cache again
    generate(model, PROMPTS, config(cache=component("cache", "dual")))


def test_load_model_and_the_cli_refuse_in_one_line():
    from click.testing import CliRunner

    from dllm_decode.cli import main
    from dllm_decode.models.loading import ModelLoadError, load_model

    with pytest.raises(ModelLoadError, match="block-sparse already"):
        load_model("embedded-bd", attention="sparsed")
    with pytest.raises(ModelLoadError, match="unknown attention"):
        load_model("embedded", attention="sparse")
    runner = CliRunner()
    for args, words in [(["--attention", "sparsed:tile=0"], "tile must be >= 1"),
                        (["--attention", "sparsed", "--cache", "prefix"], "runs only under the caches"),
                        (["--attention", "sparsed", "--model", "embedded-bd"], "block-sparse already"),
                        (["eval", "--attention", "sparsed:select=2", "--out", "x"], "select must be")]:
        result = runner.invoke(main, [*args, "--prompt", "sort : bob"] if args[0] != "eval" else args)
        assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output, result.output


def test_capture_runs_eagerly_with_a_reason():
    from dllm_decode.capture.dispatch import capture_problem

    assert "attention back end" in capture_problem(NoCache(), model_with("sparsed"))


def test_a_row_waiting_for_its_batch_mates_does_not_advance_its_step():
    state = SparseD(skip=0.0).new_state(tiny_llada())
    canvas = torch.tensor([[1, 36, 36, 36], [2, 36, 36, 36]])
    state.begin(canvas, None)
    canvas[0, 1] = 5                                   # row 1's block is done: it waits, no commit
    state.begin(canvas, None)
    assert state.step.tolist() == [1, 0] and state.building.tolist() == [True, False]
    grown = torch.cat([canvas, torch.tensor([[3, 36, 36, 36]])])   # a request joins the batch
    state.begin(grown, None)
    assert state.step.tolist() == [1, 0, 0] and state.gen.tolist() == [3, 3, 3]
    assert state.select_rows(torch.tensor([2])).step.tolist() == [0]


def test_tile_attention_equals_sdpa_under_the_expanded_pattern():
    model = model_with({"name": "sparsed", "select": 0.3, "skip": 0.0, "tile": 2})
    canvas, mask = padded_canvas(model)
    state = NoCache().init_state(model)
    for column in (9, 10, 11):                          # forwards n = 0, 1 (build), 2 (sparse)
        NoCache().logits(model, canvas, mask, (0, 17), 0, state)
        canvas[:, column] = 7
    state.begin(canvas, mask)
    assert state.any_sparse
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 17, 8), torch.randn(2, 4, 17, 8), torch.randn(2, 4, 17, 8)
    real = mask.bool()
    for start in (0, 9):                                # every query, and the compact last layer's rows
        expanded = state.mask(0, 17 - start, start)
        assert (expanded.sum(-1) < real.sum(-1)[:, None, None]).any()     # some real keys dropped
        expected = torch.nn.functional.scaled_dot_product_attention(q[:, :, start:], k, v, attn_mask=expanded)
        actual = sparsed.tile_attention(q[:, :, start:], k, v, state.plans[0], real.long().argmax(1), 2, start)
        keep = real[:, start:]
        assert_logits_close(actual.transpose(1, 2)[keep], expected.transpose(1, 2)[keep])


def test_the_compatibility_matrix_shows_the_attention_back_ends():
    from dllm_decode.caches import DualCache
    from dllm_decode.compat import try_attention
    from dllm_decode.schedulers import ThresholdScheduler

    llada, sdar = tiny_llada(), tiny_block_diffusion("sdar")
    assert try_attention(llada, "sparsed", ThresholdScheduler(), NoCache()).ok
    assert try_attention(sdar, "dense", ThresholdScheduler(), NoCache()).ok
    refused = try_attention(sdar, "sparsed", ThresholdScheduler(), NoCache())
    assert not refused.ok and "block-sparse already" in refused.reason
    assert "runs only under the caches ['none']" in try_attention(llada, "sparsed", ThresholdScheduler(), DualCache()).reason
    assert llada.__dict__.get("attention_backend") is None           # probed on a copy


def test_a_resumed_requests_file_notices_another_attention_back_end():
    from dllm_decode.runkey import load_identity, what_changed

    dense = {"model": {"name": "embedded"}}
    sparse = {"model": {"name": "embedded", **load_identity(attention="sparsed:tile=8")}}
    assert what_changed(dense, sparse) == ["attention None -> 'sparsed:tile=8'"]
    assert load_identity() == {}


@pytest.mark.parametrize("rule", ["info_gain", "leap"])
def test_a_rule_whose_extra_forwards_skip_the_pattern_is_refused_in_one_line(rule):
    """Look-ahead forwards call the model outside the cache, without the back end's per-request
    state: under SparseD they would run dense attention silently, so the request is refused."""
    model = set_attention(tiny_llada(), "sparsed")
    config = DecodeConfig(scheduler=component("scheduler", rule), gen_length=8, block_length=4)
    with pytest.raises(ValueError, match="look-ahead or guide") as caught:
        generate(model, [[1, 2, 3]], config)
    assert "\n" not in str(caught.value)
    dense = set_attention(tiny_llada(), "dense")
    assert generate(dense, [[1, 2, 3]], config).tokens.shape[1] == 8
