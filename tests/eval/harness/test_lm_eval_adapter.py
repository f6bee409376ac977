"""The lm-eval adapter's `generate_until` and log-likelihoods, on a stub of lm-eval's `Instance`
(lm_eval optional)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from dllm_decode.eval.harness.lm_eval_adapter import DllmDecodeLM
from tests.eval.harness.answer_key import AnswerKeyModel


@dataclass
class Request:
    """lm-eval's `Instance` as the adapter sees it: `args = (context, gen_kwargs)`."""

    args: tuple


def test_generate_until_decodes_and_cuts_at_stop_strings():
    key = {"copy : alice bob": "alice bob carol", "reverse : dan emma": "emma dan"}
    lm = DllmDecodeLM(model=AnswerKeyModel(key, 6), scheduler="low_confidence",
                      **{"scheduler.steps_per_block": "3"}, gen_length=6, batch_size=2)
    requests = [Request(("copy : alice bob", {"until": ["carol"]})),
                Request(("reverse : dan emma", {"until": "\n"})),
                Request(("copy : alice bob", {}))]
    assert lm.generate_until(requests) == ["alice bob ", "emma dan", "alice bob carol"]
    assert lm.config.scheduler.steps_per_block == 3


def test_max_gen_toks_rounds_up_to_blocks_and_bad_args_fail():
    lm = DllmDecodeLM(model=AnswerKeyModel({}, 8), gen_length=8, block_length=4)
    assert lm._canvas(5).gen_length == 8 and lm._canvas(None).gen_length == 8
    assert lm._canvas(9).gen_length == 12 and lm._canvas(9).block_length == 4
    with pytest.raises(ValueError, match="unknown model_args"):
        DllmDecodeLM(model=AnswerKeyModel({}, 8), top_p="0.9")
    with pytest.raises(ValueError, match="threshold"):
        DllmDecodeLM(model=AnswerKeyModel({}, 8), **{"scheduler.threshold": "3"})
    for bad in ({"mc_num": "10", "mc_batch": "4"}, {"cfg": "-1"}):
        with pytest.raises(ValueError, match="mc_num|cfg"):
            DllmDecodeLM(model=AnswerKeyModel({}, 8), **bad)


def test_cuda_without_cuda_falls_back_to_cpu_and_lm_eval_flags_are_accepted(monkeypatch):
    from dllm_decode.eval.harness import lm_eval_adapter

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="CUDA is not available"):
        assert lm_eval_adapter._device("cuda:0") == "cpu"
    assert lm_eval_adapter._device("cpu") == "cpu" and lm_eval_adapter._device(None) is None
    lm = DllmDecodeLM(model=AnswerKeyModel({}, 8), gen_length=8, batch_size="4", max_batch_size=16)
    assert lm.batch_size == 4
    for bad in ("auto", "0"):
        with pytest.raises(ValueError, match="batch_size"):
            DllmDecodeLM(model=AnswerKeyModel({}, 8), batch_size=bad)
    with pytest.raises(ValueError, match="dtype"):
        lm_eval_adapter._load("embedded", None, "float8")


def test_loglikelihood_scores_the_continuation_after_lm_evals_split(embedded):
    from dllm_decode.likelihood import loglikelihood

    lm = DllmDecodeLM(model=embedded, mc_num="8", mc_batch="8", seed="3")
    encode = lambda text: embedded.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert lm._encode_pair("sort : mia ella ", "hank") == (encode("sort : mia ella"), encode("hank"))
    requests = [Request(("sort : mia ella hank", " ella hank mia")), Request(("sort : mia ella hank", " mia hank ella"))]
    (right, greedy), (wrong, _) = lm.loglikelihood(requests)
    assert greedy is False and right > wrong
    assert right == loglikelihood(embedded, encode("sort : mia ella hank"), encode("ella hank mia"),
                                  mc_num=8, mc_batch=8, seed=3)


def test_loglikelihood_rolling_is_the_elbo_after_one_end_of_text(embedded):
    pytest.importorskip("lm_eval")
    from dllm_decode.likelihood import loglikelihood

    lm = DllmDecodeLM(model=embedded, mc_num="8", mc_batch="8")
    tokens = embedded.tokenizer("mia ella hank tom", add_special_tokens=False)["input_ids"]
    (score,) = lm.loglikelihood_rolling([Request(("mia ella hank tom",))])
    assert score == loglikelihood(embedded, [embedded.eos_token_ids[0]], tokens, mc_num=8, mc_batch=8)
