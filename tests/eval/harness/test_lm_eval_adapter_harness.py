"""The adapter under the real lm-evaluation-harness, on the local offline tasks (skipped without it)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from dllm_decode.eval.harness import lm_eval_adapter
from dllm_decode.eval.tasks import TASKS


def _load_docs():
    """`eval/harness/lm_eval_tasks/docs.py` as lm-eval imports it: by path, not as a package module."""
    spec = importlib.util.spec_from_file_location("docs", lm_eval_adapter.TASKS_DIR / "docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_task_documents_are_the_suites_test_examples():
    pytest.importorskip("datasets")
    docs = _load_docs().load(dllm_task="sort", dllm_n=4, dllm_seed=3, model="embedded")["test"]
    examples = TASKS["sort"].examples("test", 4, 3)
    assert [(d["prompt"], d["answer"]) for d in docs] == [(e.prompt, e.answer) for e in examples]


def test_multiple_choice_documents_hold_the_answer_among_other_orders():
    pytest.importorskip("datasets")
    docs = _load_docs().load_mc(dllm_task="sort", dllm_n=30, dllm_seed=1)["test"]
    examples = {e.prompt: e for e in TASKS["sort"].examples("test", 30, 1)}
    assert len(docs) >= 20
    for doc in docs:
        answer = examples[doc["prompt"]].answer
        assert len(set(doc["choices"])) == 4 and doc["choices"][doc["label"]] == answer
        assert all(sorted(c.split()) == sorted(answer.split()) for c in doc["choices"])
    assert len({doc["label"] for doc in docs}) > 1         # the answer's place varies


def _random_like(model):
    """The model with seeded random weights: same vocabulary and tokenizer, no knowledge."""
    import copy

    random = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in random.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3 if p.dim() > 1 else torch.ones(p.shape))
    return random


@pytest.mark.slow
def test_multiple_choice_by_log_likelihood_beats_chance_only_with_a_trained_model(monkeypatch, embedded):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    manager = TaskManager(include_path=str(lm_eval_adapter.TASKS_DIR), include_defaults=False)
    scores = {}
    for name, model in (("embedded", embedded), ("random", _random_like(embedded))):
        lm = lm_eval_adapter.DllmDecodeLM(model=model, mc_num=8, mc_batch=8)
        out = lm_eval.simple_evaluate(model=lm, tasks=["dllm_sort_mc"], task_manager=manager, limit=60)
        scores[name] = out["results"]["dllm_sort_mc"]["acc,none"]
    # chance is 25%: 60 questions put a random model within 0.25 +- 3 x 0.056
    assert scores["embedded"] >= 0.7 and scores["random"] <= 0.42, scores


@pytest.mark.slow
def test_simple_evaluate_scores_the_embedded_model_high_and_a_random_one_low(monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    manager = TaskManager(include_path=str(lm_eval_adapter.TASKS_DIR), include_defaults=False)
    scores = {}
    for model in ("embedded", "tiny"):
        out = lm_eval.simple_evaluate(model="dllm_decode", model_args=f"model={model},scheduler=threshold",
                                      tasks=["dllm_copy"], task_manager=manager, limit=5, device="cpu",
                                      log_samples=True)
        scores[model] = out["results"]["dllm_copy"]["exact_match,none"]
        responses = [s["filtered_resps"][0] for s in out["samples"]["dllm_copy"]]
        assert len(responses) == 5 and not any("<|endoftext|>" in r for r in responses)
    # The embedded model copies word lists; tiny is random weights over another vocabulary.
    assert scores["embedded"] >= 0.8 and scores["tiny"] == 0.0


@pytest.mark.slow
def test_command_line_with_a_cache_scores_as_the_suites_own_scorer(monkeypatch, tmp_path):
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", [
        "lm_eval", "--model", "dllm_decode", "--model_args",
        "model=embedded,scheduler=low_confidence,scheduler.steps_per_block=16,cache=prefix,"
        "cache.refresh_every=1",
        "--tasks", "dllm_sort", "--include_path", str(lm_eval_adapter.TASKS_DIR), "--limit", "6",
        "--batch_size", "3", "--output_path", str(tmp_path), "--log_samples"])
    if torch.cuda.is_available():       # lm-eval's default device is cuda:0
        lm_eval_adapter.main()
    else:
        with pytest.warns(UserWarning, match="CUDA is not available"):
            lm_eval_adapter.main()
    result = json.loads(next(tmp_path.rglob("results_*.json")).read_text())
    exact = result["results"]["dllm_sort"]["exact_match,none"]
    samples = [json.loads(line) for line in next(tmp_path.rglob("samples_dllm_sort_*.jsonl")).open()]
    examples = {e.prompt: e for e in TASKS["sort"].examples("test", 50, 0)}
    ours = [TASKS["sort"].score(examples[s["doc"]["prompt"]], s["filtered_resps"][0]) for s in samples]
    # Refreshing every step makes the prefix cache exact, so sort is solved as often as without it.
    assert len(ours) == 6 and 0.0 < exact <= 1.0
    assert exact == pytest.approx(sum(ours) / len(ours))
