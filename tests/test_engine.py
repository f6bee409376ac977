"""The step-wise engine: continuous batching over `Decoding`, first done first out, streaming."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.engine import Engine, Request, SpeculativeModel
from dllm_decode.registry import component
from dllm_decode.sampler import generate
from dllm_decode.testing import OracleMaskPredictor, tiny_llada_with_tokenizer


def config(scheduler="threshold", **fields) -> DecodeConfig:
    return DecodeConfig(scheduler=component("scheduler", scheduler), **fields)


def run(engine: Engine) -> tuple[dict, dict, list[list]]:
    """Step to the end: final outputs, streamed text per request, and each step's updates."""
    outputs, streamed, steps = {}, {}, []
    while engine.has_work:
        updates = engine.step()
        steps.append(updates)
        for u in updates:
            streamed[u.request_id] = streamed.get(u.request_id, "") + u.text
            if u.finished:
                assert u.request_id not in outputs, "a request finished twice"
                outputs[u.request_id] = u.output
    return outputs, streamed, steps


def prompts_of(model, n: int) -> list[list[int]]:
    from dllm_decode.eval.tasks import TASKS

    examples = TASKS["sort"].examples("test", n, 0) + TASKS["copy"].examples("test", n, 1)
    return [model.tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]


def test_greedy_answers_equal_decoding_alone_in_a_busy_engine(embedded):
    """Mixed configs and prompt lengths, more requests than rows: every answer, its streamed
    text and its NFE equal `generate` on the request alone."""
    configs = [config(gen_length=32, block_length=8),
               config("low_confidence", gen_length=16, block_length=8),
               config({"name": "threshold", "threshold": 0.7}, gen_length=32, block_length=16,
                      cache=component("cache", "prefix"))]
    prompts = prompts_of(embedded, 6)
    engine = Engine(embedded, max_batch_size=5)
    requests = [Request(f"r{i}", p, dataclasses.replace(configs[i % 3], seed=i))
                for i, p in enumerate(prompts)]
    for request in requests:
        engine.add(request)
    outputs, streamed, _ = run(engine)
    assert sorted(outputs) == sorted(r.id for r in requests)
    for request in requests:
        alone = generate(embedded, [list(request.prompt)], request.config)
        out = outputs[request.id]
        assert out.text == alone.text[0] and streamed[request.id] == out.text
        assert out.tokens == tuple(alone.tokens[0, :int(alone.answer_lengths[0])].tolist())
        assert out.nfe <= int(alone.nfe[0]) and out.finish_reason == "stop"
        assert out.prompt_tokens == len(request.prompt)
    assert not engine.lives and not engine.backend.lives


def test_tiny_model_noise_is_batch_invariant_too():
    """The random tiny model writes no early end-of-text: every row runs its whole canvas."""
    model = tiny_llada_with_tokenizer()
    cfg = config("low_confidence", gen_length=12, block_length=4)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10], [11, 12]]
    engine = Engine(model, max_batch_size=3)
    for i, p in enumerate(prompts):
        engine.add(Request(str(i), p, cfg))
    outputs, streamed, _ = run(engine)
    for i, p in enumerate(prompts):
        alone = generate(model, [p], cfg)
        assert outputs[str(i)].text == alone.text[0] == streamed[str(i)]


def oracle(g: int = 8, eos_at: int | None = None, vocab: int = 11):
    """Oracle whose answer is tokens 1..g (EOS at `eos_at`), confidence falling left to right, so
    `low_confidence` commits one token per step from the left."""
    target = torch.arange(1, g + 1)
    if eos_at is not None:
        target[eos_at] = vocab - 2
    confidence = torch.linspace(0.9, 0.5, g)
    return OracleMaskPredictor(target, confidence, vocab, mask_token_id=vocab - 1, eos_token_id=vocab - 2)


def test_a_request_leaves_as_soon_as_its_answer_is_final():
    """Two rows of one group: the one cut at 2 tokens reports after step 2 with NFE 2, while its
    neighbour streams one token per step and reports after step 8."""
    model = oracle()
    cfg = config("low_confidence", gen_length=8, block_length=8)
    engine = Engine(model)
    engine.add(Request("short", [3, 4], cfg, max_tokens=2))
    engine.add(Request("long", [3, 4, 5], cfg))
    outputs, _, steps = run(engine)
    finished_at = {u.request_id: i + 1 for i, us in enumerate(steps) for u in us if u.finished}
    assert finished_at == {"short": 2, "long": 8}
    assert not engine.backend.lives and engine.steps == 8
    assert outputs["short"].tokens == (1, 2) and outputs["short"].nfe == 2
    assert outputs["short"].finish_reason == outputs["long"].finish_reason == "length"
    assert outputs["long"].tokens == tuple(range(1, 9)) and outputs["long"].nfe == 8
    long_tokens = [u.tokens for us in steps for u in us if u.request_id == "long"]
    assert long_tokens == [(t,) for t in range(1, 9)]


def test_an_end_of_text_in_the_final_prefix_ends_the_request_early():
    """With `stop_at_eos` off the row decodes its whole canvas, but the answer is final (and
    reported) once the end-of-text token at position 3 is committed."""
    model = oracle(eos_at=3)
    cfg = config("low_confidence", gen_length=8, block_length=8, stop_at_eos=False)
    engine = Engine(model)
    engine.add(Request("a", [5], cfg))
    engine.add(Request("b", [5, 6], dataclasses.replace(cfg, stop_at_eos=True)))
    outputs, _, steps = run(engine)
    finished_at = {u.request_id: i + 1 for i, us in enumerate(steps) for u in us if u.finished}
    assert finished_at == {"a": 4, "b": 4}
    assert outputs["a"].tokens == outputs["b"].tokens == (1, 2, 3)
    assert outputs["a"].finish_reason == "stop" and outputs["a"].text is None


def test_admission_is_fifo_within_max_batch_size():
    model = oracle()
    cfg = config("low_confidence", gen_length=8, block_length=8)
    engine = Engine(model, max_batch_size=2)
    for i in range(5):
        engine.add(Request(str(i), [3], cfg, max_tokens=1 + i))
    order, rows = [], []
    while engine.has_work:
        for u in engine.step():
            if u.finished:
                order.append(u.request_id)
        rows.append(engine.rows_in_use)
        assert engine.stats()["running"] <= 2
    assert order == ["0", "1", "2", "3", "4"]
    assert max(rows) <= 2


def test_cancel_a_waiting_and_a_running_request():
    model = oracle()
    cfg = config("low_confidence", gen_length=8, block_length=8)
    engine = Engine(model, max_batch_size=1)
    engine.add(Request("run", [3], cfg))
    engine.add(Request("wait", [3], cfg))
    engine.step()
    assert engine.cancel("wait") and not engine.cancel("nope")
    updates = engine.step()
    cancelled = [u for u in updates if u.finished]
    assert [(u.request_id, u.output.finish_reason) for u in cancelled] == [("wait", "cancelled")]
    assert engine.cancel("run")
    outputs, _, _ = run(engine)
    assert outputs["run"].finish_reason == "cancelled"
    assert not engine.has_work and engine.steps < 8   # the group left with its last request
    assert not engine.cancel("run")


def test_sampled_requests_draw_their_own_samples_in_a_busy_engine():
    """Each request decodes under its own generator (its seed): sampled answers equal the
    request decoded alone, whatever else runs beside it."""
    model = tiny_llada_with_tokenizer()
    cfg = config(gen_length=16, block_length=8, temperature=1.0)
    requests = [Request(f"s{i}", [3 + i, 4], dataclasses.replace(cfg, seed=i)) for i in range(3)]
    engine = Engine(model, max_batch_size=3)
    for request in requests:
        engine.add(request)
    outputs, _, _ = run(engine)
    for request in requests:
        alone = generate(model, [list(request.prompt)], request.config)
        answer = alone.tokens[0].tolist()
        eos = next((i for i, t in enumerate(answer) if t in model.eos_token_ids), len(answer))
        assert list(outputs[request.id].tokens) == answer[:eos]


def test_requests_with_the_same_cache_share_one_running_batch():
    model = oracle()
    cfg = config("low_confidence", gen_length=8, block_length=8)
    engine = Engine(model)
    engine.add(Request("a", [3], cfg))
    engine.add(Request("b", [3, 4], dataclasses.replace(cfg, seed=9)))
    engine.add(Request("c", [3], dataclasses.replace(cfg, temperature=0.5, gen_length=4, block_length=4)))
    engine.step()
    assert engine.stats()["groups"] == 1 and engine.rows_in_use == 3


def test_a_cache_the_model_cannot_use_is_refused_and_the_others_finish():
    """A request whose cache cannot serve the model is refused when added (before any work,
    as the server's admission check); the others finish."""
    model = oracle()
    cfg = config("low_confidence", gen_length=8, block_length=8)
    engine = Engine(model)
    engine.add(Request("ok", [3], cfg))
    with pytest.raises(ValueError, match="KV cache"):
        engine.add(Request("bad", [3], dataclasses.replace(cfg, cache=component("cache", "prefix"))))
    outputs, _, _ = run(engine)
    assert "bad" not in outputs
    assert outputs["ok"].finish_reason == "length" and len(outputs["ok"].tokens) == 8


def test_bad_requests_are_refused_with_one_line():
    model = tiny_llada_with_tokenizer()
    engine = Engine(model)
    with pytest.raises(ValueError, match="prompt is empty"):
        Request("x", [], config())
    with pytest.raises(ValueError, match="max_tokens"):
        Request("x", [1], config(), max_tokens=0)
    with pytest.raises(ValueError, match="exceeds the model's context of 512"):
        engine.add(Request("x", [1] * 400, config(gen_length=128)))
    engine.add(Request("x", [1], config()))
    with pytest.raises(ValueError, match="already in flight"):
        engine.add(Request("x", [2], config()))
    with pytest.raises(ValueError, match="max_batch_size"):
        Engine(model, max_batch_size=0)


def test_a_causal_lm_is_served_one_request_per_group():
    from dllm_decode.speculative import LookupDrafter, Sampling, SpecConfig, speculative_generate
    from dllm_decode.models.causal import load_causal_lm

    target = load_causal_lm("ar_target")
    engine = Engine(SpeculativeModel(target, LookupDrafter()), max_batch_size=2)
    cfg = config(gen_length=12, block_length=12)
    prompts = [target.tokenizer(p, add_special_tokens=False)["input_ids"]
               for p in ("sort : mia ella =", "copy : tom ann =", "sort : bob al =")]
    for i, p in enumerate(prompts):
        engine.add(Request(str(i), p, cfg))
    outputs, streamed, _ = run(engine)
    for i, p in enumerate(prompts):
        alone = speculative_generate(target, p, SpecConfig(scheduler=cfg.scheduler, max_new_tokens=12,
                                                           sampling=Sampling()), LookupDrafter())
        assert outputs[str(i)].text == alone.text.strip() == streamed[str(i)]
        assert outputs[str(i)].nfe == alone.target_forwards
    with pytest.raises(ValueError, match="filters"):
        engine.check(Request("f", [1], dataclasses.replace(cfg, filters=(component("filter", "eotp"),))))


def test_a_second_thread_calling_the_engine_is_refused():
    import threading

    inner, entered, release = tiny_llada_with_tokenizer(), threading.Event(), threading.Event()

    class Slow(torch.nn.Module):
        mask_token_id, eos_token_ids = inner.mask_token_id, inner.eos_token_ids
        vocab_size, max_length, tokenizer = inner.vocab_size, inner.max_length, inner.tokenizer

        def forward(self, *args, **kwargs):
            entered.set()
            release.wait(10)
            return inner(*args, **kwargs)

    engine = Engine(Slow())
    engine.add(Request("a", [1, 2], config(gen_length=8, block_length=8)))
    worker = threading.Thread(target=engine.step)
    worker.start()
    assert entered.wait(10)
    try:
        for call in (engine.step, lambda: engine.add(Request("b", [1], config())), lambda: engine.cancel("a")):
            with pytest.raises(RuntimeError, match="in use by another thread"):
                call()
        engine.check(Request("c", [1], config()))        # reads no engine state: allowed
    finally:
        release.set()
        worker.join()
    outputs, _, _ = run(engine)
    assert outputs["a"].finish_reason in ("stop", "length")


def test_a_request_prompt_must_be_token_ids():
    for bad in ("hello", [1, 2.5], [True], ["3"]):
        with pytest.raises(TypeError, match="token ids|integers"):
            Request("x", bad, config())


def test_a_request_that_does_not_follow_its_text_gets_one_update_with_the_same_answer(embedded):
    """`follow=False` (an unstreamed request without stop strings): no text while it runs and
    no tokenizer call per step, then the same `Output` and the whole text in its last update."""
    prompts = prompts_of(embedded, 2)
    outputs = {}
    for follow in (True, False):
        engine = Engine(embedded, max_batch_size=4)
        for i, p in enumerate(prompts):
            engine.add(Request(f"r{i}", p, config("low_confidence", gen_length=16, block_length=8),
                               follow=follow))
        done, streamed, steps = run(engine)
        outputs[follow] = {k: (o.text, o.tokens, o.nfe, o.finish_reason) for k, o in done.items()}
        updates = [u for step in steps for u in step]
        if follow:
            assert not all(u.finished for u in updates)        # text arrived as it grew
        else:
            assert all(u.finished for u in updates)            # one update per request
            assert all(streamed[k] == done[k].text for k in done)
    assert outputs[True] == outputs[False]
