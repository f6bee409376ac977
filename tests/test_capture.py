"""The captured step: static shapes, no graph break, no recompile, no extra host sync, and the
tokens and NFE of the eager loop.

Graph-break and recompile checks compile with `backend="eager"` (a dynamo property, seconds);
one inductor run per cache is marked slow. Models are tiny, seeded and float32; tokens are
compared exactly (greedy decodes of the same logits up to float rounding of padded shapes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from dllm_decode.caches import CACHES
from dllm_decode.capture import CAPTURE_MODES, Buckets, GraphCache, capture_problem, fused_problem
from dllm_decode.capture import CapturedExecutor
from dllm_decode.config import DecodeConfig
from dllm_decode.interfaces import Decision
from dllm_decode.sampler import Decoding, generate
from dllm_decode.schedulers import SCHEDULERS, ThresholdScheduler
from dllm_decode.step import step_input
from dllm_decode.testing import tiny_block_diffusion, tiny_llada
from dllm_decode.filters import EoTPFilter
from tests.test_host_syncs import SyncCounter

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]
"""Three rows of different lengths: left padding, and a batch bucket of 4 (one dummy row)."""


def tiny_dream(seed: int = 0) -> Any:
    from dllm_decode.models.dream import DreamConfig, DreamModel

    model = DreamModel(DreamConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=48, vocab_size=37,
                                   mask_token_id=36, eos_token_id=35, pad_token_id=35,
                                   max_position_embeddings=512, rope_theta=10000.0))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(noise * 0.3 if p.dim() > 1 else 1 + 0.2 * noise)
    return model.eval()


MODELS = {"llada": lambda: tiny_llada(layers=2), "dream": tiny_dream,
          "sdar": lambda: tiny_block_diffusion("sdar", block_size=4),
          "fast_dllm": lambda: tiny_block_diffusion("fast_dllm", block_size=4)}
CASES = [("llada", "none"), ("llada", "dual"), ("dream", "none"), ("dream", "dual"),
         ("sdar", "none"), ("sdar", "block"), ("fast_dllm", "block")]


class PerStep(ThresholdScheduler):
    """The threshold rule declared not capturable: the decode runs the per-step loop, only its
    model forward through the captured step."""

    capturable = False


def config(cache: str, tau: float = 0.3, scheduler: Any = None, fused: bool = False) -> DecodeConfig:
    rule = ThresholdScheduler(threshold=tau) if fused else PerStep(threshold=tau)
    return DecodeConfig(scheduler=scheduler or rule, cache=CACHES[cache](), gen_length=16,
                        block_length=4, stop_at_eos=False)


@pytest.fixture
def strict_dynamo():
    """Recompiles are errors; graph-break counters start empty."""
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize("family,cache", [c if c != ("sdar", "none") else
                                          pytest.param(*c, marks=pytest.mark.slow) for c in CASES])
def test_compiled_step_has_no_graph_break_nor_recompile_and_equals_generate(strict_dynamo, family, cache):
    model = MODELS[family]()
    cfg = dataclasses.replace(config(cache), gen_length=8)      # two blocks: few buckets, fast
    graphs = GraphCache("compile", backend="eager")
    eager = generate(model, PROMPTS, cfg)
    captured = generate(model, PROMPTS, cfg, capture=graphs)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert graphs.captures >= 1 and counters["stats"]["unique_graphs"] == graphs.captures
    assert torch.equal(captured.tokens, eager.tokens)
    assert torch.equal(captured.nfe, eager.nfe)


@pytest.mark.parametrize("tau", [0.9, 0.3])
@pytest.mark.parametrize("family,cache", CASES + [("llada", "prefix"), ("fast_dllm", "none")])
def test_static_step_equals_generate(family, cache, tau):
    """The bucketed step run eagerly: padded rows (3 -> 4), padded windows, scratch column."""
    model = MODELS[family]()
    eager = generate(model, PROMPTS, config(cache, tau))
    decoding = Decoding(model, CACHES[cache](), capture="static")
    key = decoding.add(PROMPTS, config(cache, tau))
    while not decoding.finished:
        decoding.step()
    captured = decoding.result(key)
    assert decoding.capture_problem is None and decoding.runner is not decoding.cache
    assert torch.equal(captured.tokens, eager.tokens) and torch.equal(captured.nfe, eager.nfe)


def test_static_step_with_sampling_repeats_the_eager_draws():
    """Noise is drawn on the host side of the step with the request's own generator."""
    model = MODELS["llada"]()
    cfg = dataclasses.replace(config("dual"), temperature=0.8, seed=7)
    assert torch.equal(generate(model, PROMPTS, cfg, capture="static").tokens,
                       generate(model, PROMPTS, cfg).tokens)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("cache", ["none", "dual"])
def test_bucket_invariance(cache, fused):
    """A request decoded alone (batch bucket 1) equals its row in a batch of 8 (bucket 8)."""
    model = MODELS["llada"]()
    prompts = [[5 + i, 6, 7 + i % 3, 8][: 2 + i % 3] for i in range(8)]
    alone = generate(model, prompts[3:4], config(cache, fused=fused), capture="static")
    together = generate(model, prompts, config(cache, fused=fused), capture="static")
    assert torch.equal(together.tokens[3:4], alone.tokens)


def test_row_drops_move_to_a_smaller_bucket():
    """Rows that stop at end-of-text leave; their K/V rows move to the smaller bucket."""
    model = MODELS["llada"]()
    cfg = dataclasses.replace(config("dual"), stop_at_eos=True, gen_length=24)
    prompts = [[5 + i, 6, 7] for i in range(5)]
    assert torch.equal(generate(model, prompts, cfg, capture="static").tokens,
                       generate(model, prompts, cfg).tokens)


def test_negative_control_a_branch_on_the_step_breaks_fullgraph():
    """A rule that branches on a tensor step cannot be traced whole: the check can fail."""

    class Branchy(ThresholdScheduler):
        def select(self, inp, state):
            if inp.step == 0:
                return Decision(commit=inp.eligible), state
            return Decision(commit=inp.confidence >= self.threshold), state

    inp = _random_input(torch.Generator().manual_seed(0), tensor_counters=True)
    compiled = torch.compile(lambda i: Branchy().select(i, None)[0].commit, fullgraph=True,
                             backend="eager")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="(?i)data-dependent|graph break|Unsupported|generic_jump"):
        compiled(inp)
    torch._dynamo.reset()


def _random_input(generator: torch.Generator, tensor_counters: bool, batch: int = 3, width: int = 8,
                  vocab: int = 11):
    logits = torch.randn(batch, width, vocab, generator=generator) * 3
    current = torch.where(torch.rand(batch, width, generator=generator) < 0.6, vocab - 1, 1)
    step = torch.tensor(1) if tensor_counters else 1
    num_steps = torch.tensor(width) if tensor_counters else width
    return step_input(logits=logits, current=current, mask_id=vocab - 1, step=step,
                      num_steps=num_steps)


CAPTURABLE = sorted(name for name, kind in SCHEDULERS.items() if getattr(kind, "capturable", False))


def test_the_three_fast_rules_are_capturable():
    assert {"threshold", "factor", "low_confidence"} <= set(CAPTURABLE)


@pytest.mark.parametrize("name", CAPTURABLE)
def test_capturable_scheduler_select_compiles_fullgraph(name):
    """Every rule marked `capturable` traces whole with 0-d tensor step and budget, and decides
    as it does with Python ints."""
    scheduler = SCHEDULERS[name]()
    state = scheduler.init_state(3, torch.device("cpu"))
    compiled = torch.compile(lambda i: scheduler.select(i, state)[0].commit, fullgraph=True,
                             dynamic=False, backend="eager")
    torch._dynamo.reset()
    for seed in range(3):
        traced = compiled(_random_input(torch.Generator().manual_seed(seed), tensor_counters=True))
        eager = scheduler.select(_random_input(torch.Generator().manual_seed(seed), False),
                                 state)[0].commit
        assert torch.equal(traced, eager)
    torch._dynamo.reset()


def test_one_host_sync_per_step_under_capture(monkeypatch):
    counter = SyncCounter(monkeypatch)
    result = generate(MODELS["llada"](), PROMPTS, config("dual"), capture="static")
    assert counter.steps >= int(result.nfe.max()) > 0
    assert counter.syncs <= counter.steps + counter.blocks, (counter.syncs, counter.steps)


def test_capture_problem_names_the_reason_and_falls_back():
    model = MODELS["llada"]()
    assert capture_problem(config("dual"), model) is None
    assert "d2" in capture_problem(CACHES["d2"](), model).lower() or \
        "rows from the data" in capture_problem(CACHES["d2"](), model)
    assert capture_problem(config("none"), tiny_block_diffusion("llada2")) is not None
    decoding = Decoding(model, CACHES["d2"](), capture="static")
    assert decoding.capture_problem and decoding.runner is decoding.cache


def test_bad_capture_arguments_are_one_line_errors():
    model = MODELS["llada"]()
    with pytest.raises(ValueError, match="capture must be one of"):
        Decoding(model, CACHES["none"](), capture="fast")
    with pytest.raises(TypeError, match="capture must be one of"):
        Decoding(model, CACHES["none"](), capture=1)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA device"):
            GraphCache("cuda-graphs")
    assert CAPTURE_MODES[0] == "off"


def test_buckets():
    b = Buckets(max_batch=8, block_length=32, widths=(33,))
    assert b.batches == (1, 2, 4, 8) and b.batch(3) == 4 and b.batch(9) == 16
    assert b.length(65) == 128 and b.width(33, 200) == 33 and b.width(40, 200) == 64
    assert b.width(300, 129) == 129
    with pytest.raises(ValueError, match="max_batch"):
        Buckets(max_batch=0)


# -- the fused step: forward, decision, write and status in one graph ----------------------------

FUSED = [("llada", "none"), ("llada", "dual"), ("dream", "none"), ("dream", "dual")]


@pytest.mark.parametrize("family,cache", FUSED)
def test_fused_step_compiles_whole_without_recompiles_and_equals_generate(strict_dynamo, family, cache):
    model = MODELS[family]()
    cfg = config(cache, fused=True)
    assert fused_problem(cfg, model) is None
    graphs = GraphCache("compile", backend="eager")
    captured = generate(model, PROMPTS, cfg, capture=graphs)
    eager = generate(model, PROMPTS, cfg)
    assert not counters["graph_break"], dict(counters["graph_break"])
    # one graph per bucket, made once (finished rows leave: the batch moves to a smaller bucket)
    assert graphs.captures == len(graphs.entries) <= {"none": 3, "dual": 6}[cache]   # batch 4, 2, 1
    assert all(key[0] == "step" for key in graphs.entries)
    assert torch.equal(captured.tokens, eager.tokens) and torch.equal(captured.nfe, eager.nfe)


@pytest.mark.parametrize("stop_at_eos", [False, True])
@pytest.mark.parametrize("cache", ["none", "dual", "prefix"])
@pytest.mark.parametrize("name", ["threshold", "factor", "low_confidence"])
def test_fused_decode_equals_generate(name, cache, stop_at_eos):
    model = MODELS["llada"]()
    cfg = dataclasses.replace(config(cache, scheduler=SCHEDULERS[name]()), stop_at_eos=stop_at_eos)
    assert fused_problem(cfg, model) is None
    captured, eager = generate(model, PROMPTS, cfg, capture="static"), generate(model, PROMPTS, cfg)
    assert torch.equal(captured.tokens, eager.tokens) and torch.equal(captured.nfe, eager.nfe)


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_fused_sampled_decode_draws_what_eager_draws(family, cache):
    """Noise drawn on the host with the request's generator for its live rows, read by the
    graph from a static buffer: sampled tokens and NFE equal eager's, EOS stops included."""
    model = MODELS[family]()
    cfg = dataclasses.replace(config(cache, fused=True), temperature=0.9, seed=5, stop_at_eos=True)
    assert fused_problem(cfg, model) is None
    captured, eager = generate(model, PROMPTS, cfg, capture="static"), generate(model, PROMPTS, cfg)
    assert torch.equal(captured.tokens, eager.tokens) and torch.equal(captured.nfe, eager.nfe)


def test_fused_decode_reads_the_status_once_per_step(monkeypatch):
    counter, marks = SyncCounter(monkeypatch), []
    run = CapturedExecutor.step

    def counted(*args, **kwargs):
        marks.append(counter.syncs)
        return run(*args, **kwargs)

    monkeypatch.setattr(CapturedExecutor, "step", counted)
    counter.active = True
    result = generate(MODELS["llada"](), PROMPTS, config("dual", fused=True), capture="static")
    counter.active = False
    assert len(marks) >= int(result.nfe.max()) > 1
    assert all(b - a <= 1 for a, b in zip(marks, marks[1:])), marks


def test_fused_problem_names_what_stays_on_the_host():
    model = MODELS["llada"]()
    base = config("dual", fused=True)
    assert "not capturable" in fused_problem(config("dual"), model)
    assert fused_problem(dataclasses.replace(base, temperature=0.5), model) is None
    assert "filters" in fused_problem(dataclasses.replace(base, filters=(EoTPFilter(),)), model)
    assert "block-diffusion" in fused_problem(base, MODELS["sdar"]())


@pytest.mark.slow
@pytest.mark.parametrize("family,cache,fused", [("llada", "none", True), ("llada", "dual", True),
                                                ("sdar", "block", False)])
def test_inductor_step_equals_generate(strict_dynamo, family, cache, fused):
    model = MODELS[family]()
    cfg = config(cache, fused=fused)
    graphs = GraphCache("compile")
    assert torch.equal(generate(model, PROMPTS, cfg, capture=graphs).tokens,
                       generate(model, PROMPTS, cfg).tokens)
    assert not counters["graph_break"]


def test_warm_up_before_recording_leaves_the_buffers_as_they_were(monkeypatch):
    """CUDA-graph recording warms up by running the step; a fused step commits tokens and writes
    K/V, so the warm-up must put the canvas and K/V back (checked on the CPU)."""
    from dllm_decode.capture import graphs as graphs_module

    seen = []

    def record_args(self, key, owner, args, fn=None):
        before = [a.clone() for a in args if isinstance(a, torch.Tensor)]
        graphs_module.warm_up(fn, args)
        after = [a for a in args if isinstance(a, torch.Tensor)]
        seen.append(all(torch.equal(x, y) for x, y in zip(before, after)))
        return original(self, key, owner, args, fn)

    original = GraphCache.run
    monkeypatch.setattr(GraphCache, "run", record_args)
    model = MODELS["llada"]()
    cfg = config("dual", fused=True)
    assert torch.equal(generate(model, PROMPTS, cfg, capture="static").tokens,
                       generate(model, PROMPTS, cfg).tokens)
    assert seen and all(seen)


def test_cli_flags_are_checked_in_one_line():
    from click.testing import CliRunner

    from dllm_decode.cli import main
    from dllm_decode.cli.options import capture_mode

    runner = CliRunner()
    result = runner.invoke(main, ["--prompt", "sort : mia ella", "--cuda-graphs"])
    assert result.exit_code == 2 and "needs a CUDA device" in result.output
    result = runner.invoke(main, ["--prompt", "sort : mia ella", "--cuda-graphs", "--compile"])
    assert result.exit_code == 2 and "alternatives" in result.output
    assert capture_mode(False, True, torch.device("cpu")) == "compile"
    assert capture_mode(False, False, torch.device("cpu")) == "off"
    assert "--cuda-graphs / --no-cuda-graphs" in runner.invoke(main, ["--help"]).output


def test_compile_says_it_compiles_before_the_first_step(capsys):
    """`--compile` is minutes of silence otherwise: one line on stderr says what is happening."""
    from dllm_decode.cli.options import capture_mode

    capture_mode(False, True, torch.device("cpu"))
    assert "compiled (torch.compile, often minutes)" in capsys.readouterr().err
    capture_mode(False, False, torch.device("cpu"))
    assert capsys.readouterr().err == ""


def test_a_graph_cache_reused_across_decodes_keeps_its_buffers(monkeypatch):
    """A recorded graph reads fixed addresses: every call of a bucket, in this decode or the
    next through the same GraphCache, passes tensors at the same addresses (and the second
    decode gives the same tokens)."""
    model = MODELS["llada"]()
    graphs = GraphCache("static")
    seen: dict = {}
    original = GraphCache.run

    def checked(self, key, owner, args, fn=None):
        pointers = [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]
        assert seen.setdefault(key, pointers) == pointers, f"bucket {key} moved a buffer"
        return original(self, key, owner, args) if fn is None else original(self, key, owner, args, fn)

    monkeypatch.setattr(GraphCache, "run", checked)
    for cfg in (config("dual"), config("dual", fused=True)):
        first = generate(model, PROMPTS, cfg, capture=graphs)
        pointers = _addresses(graphs)
        second = generate(model, PROMPTS, cfg, capture=graphs)
        assert pointers == _addresses(graphs)
        assert torch.equal(first.tokens, second.tokens)


def _addresses(graphs: GraphCache) -> dict:
    """The address of every static buffer a GraphCache holds (K/V, indices, step counters)."""
    out = {}
    for key, b in graphs.buffers.items():
        out[key] = (b.canvas.data_ptr(), b.attention.data_ptr(), b.kv.keys.data_ptr(),
                    b.kv.values.data_ptr(), {k: t.data_ptr() for k, t in b.windows.items()})
    return out
