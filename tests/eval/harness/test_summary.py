"""Leaderboard interpolation, PBx and AUP, oracle and theory points of
`dllm_decode.eval.harness.summary`."""

import math

import pytest

from dllm_decode.eval.harness.summary import aup, max_tps_at, summarize, theory_point

LLADA15_THRESHOLD = [(1.33, 86.4), (3.42, 83.8), (4.53, 77.5), (5.62, 68.3), (6.55, 57.9), (8.27, 47.2)]


def test_max_tps_matches_the_parallelbench_leaderboard():
    # LLaDA 1.5 confidence threshold: 4.09 at 80% ([PAGE] leaderboard JSON, spec §3.3).
    assert max_tps_at(LLADA15_THRESHOLD, 80, interpolate=True) == pytest.approx(4.09, abs=5e-3)
    # Top-k entries are reported at the largest tested point: LLaDA 1.5 confidence top-k -> 1.
    topk = [(1, 86.4), (2, 74.4), (4, 58.9), (8, 41.1)]
    assert max_tps_at(topk, 80, interpolate=False) == 1
    assert max_tps_at(topk, 90, interpolate=True) == 0.0
    assert max_tps_at(topk, 50, interpolate=False) == 4


def _record(config, task, index, score, tps, swept=("threshold",), group="g", answer=None, **extra):
    return {"config_key": config, "group": group, "task": task, "index": index, "score": score,
            "tokens_per_step": tps, "answer_tokens_per_step": tps if answer is None else answer,
            "nfe": 8 / tps, "seconds": 0.1,
            "scheduler": "threshold", "params": {}, "label": "threshold", "swept": list(swept),
            "model": "m", "gen_length": 8, "block_length": 8, "n": 3,
            "config": {"scheduler": {"name": "threshold", "threshold": 0.9}, "temperature": 0.0},
            **extra}


def test_summary_means_and_oracle():
    records = [_record("a", "copy", 0, 1.0, 1.0), _record("a", "copy", 1, 1.0, 1.0),
               _record("b", "copy", 0, 1.0, 4.0), _record("b", "copy", 1, 0.0, 2.0),
               _record("a", "sort", 0, 0.0, 1.0), _record("b", "sort", 0, 1.0, 8.0)]
    summary = summarize(records)
    cells = {(c["config_key"], c["task"]): c for c in summary["results"]}
    assert cells["b", "copy"]["accuracy"] == 50.0 and cells["b", "copy"]["tokens_per_step"] == 3.0
    configs = {c["config_key"]: c for c in summary["configurations"]}
    assert configs["a"]["mean_accuracy"] == 50.0 and configs["b"]["mean_accuracy"] == 75.0
    assert configs["b"]["tokens_per_step"] == pytest.approx((3.0 + 8.0) / 2)
    (oracle,) = summary["oracle"]        # per sample: best score, then fewest forward passes
    assert oracle["tasks"]["copy"] == {"accuracy": 100.0, "tokens_per_step": 2.5,
                                       "answer_tokens_per_step": 2.5}
    assert oracle["tasks"]["sort"] == {"accuracy": 100.0, "tokens_per_step": 8.0,
                                       "answer_tokens_per_step": 8.0}
    (entry,) = summary["leaderboard"]
    assert entry["interpolated"] and entry["max_tokens_per_step"]["70"] == pytest.approx(5.5)


def test_pbx_and_aup_use_answer_tokens_per_forward_beside_the_canvas():
    # A canvas of 8 with an answer of 2 tokens: 8 canvas tokens per step but 2 answer tokens per
    # forward at the one-step point; the answer axis is the one PBx and AUP read.
    records = [_record("a", "copy", 0, 1.0, 1.0, answer=0.25), _record("b", "copy", 0, 1.0, 8.0, answer=2.0)]
    (entry,) = summarize(records)["leaderboard"]
    assert entry["pb"]["80"] == pytest.approx(2.0)
    assert entry["max_tokens_per_step"]["80"] == pytest.approx(8.0)
    assert [p["answer_tokens_per_step"] for p in entry["points"]] == [0.25, 2.0]
    assert entry["aup"] == pytest.approx(aup([(0.25, 100.0), (2.0, 100.0)], 100.0))


def test_aup_follows_d3llm():
    # rho_1 y_1 + trapezoids of y W(y), W(y) = min(exp(-3 (1 - y / y_max)), 1); points that fall more
    # than 5 points below the least parallel one are dropped.
    points = [(1.0, 80.0), (2.0, 78.0), (4.0, 60.0)]
    w = math.exp(-3 * (1 - 78.0 / 90.0))
    expected = 1.0 * 80.0 + 0.5 * (2.0 - 1.0) * (78.0 * w + 80.0 * math.exp(-3 * (1 - 80.0 / 90.0)))
    assert aup(points, y_max=90.0) == pytest.approx(expected)
    assert aup([(2.0, 90.0), (1.0, 90.0)], y_max=90.0) == pytest.approx(1 * 90 + 0.5 * 1 * 180)
    assert aup([], 90.0) == 0.0 and aup([(1.0, 0.0)], 0.0) == 0.0


def test_theory_point_only_where_the_ideal_model_is_known():
    shuffle = _record("a", "shuffle", 0, 0.0, 1.0, gen_length=4, block_length=4, n=4)
    shuffle["config"] = {"scheduler": {"name": "random", "tokens_per_step": 2}, "temperature": 0.0}
    assert theory_point(shuffle) == pytest.approx((2.0, 0.375 * (1 - 1 / 24)))   # identity fails
    assert theory_point({**shuffle, "gen_length": 8, "block_length": 8}) is None   # EOS padding
    assert theory_point({**shuffle, "task": "copy"}) is None
    replace = {**shuffle, "task": "replace_random"}
    replace["config"] = {"scheduler": {"name": "threshold", "threshold": 0.8}, "temperature": 0.0}
    assert theory_point(replace) == pytest.approx((1.0, 1.0))     # 3/4 < 0.8: one per step
    replace["config"]["scheduler"]["threshold"] = 0.7
    assert theory_point(replace) == pytest.approx((4.0, 0.0))     # 3/4 >= 0.7: all keep at once


def test_theory_point_follows_the_ranking_of_the_scheduler():
    # Replace Random, n = 4, two per step, temperature 1 (issue 20): confidence ranking lets "keep"
    # draws win the ranks (0.5215 by enumeration); random ranking is independent of the draws.
    replace = _record("a", "replace_random", 0, 0.0, 2.0, gen_length=4, block_length=4, n=4)
    replace["config"] = {"scheduler": {"name": "low_confidence", "tokens_per_step": 2},
                         "temperature": 1.0}
    assert theory_point(replace) == pytest.approx((2.0, 0.521484375))
    replace["config"]["scheduler"]["name"] = "random"
    assert theory_point(replace) == pytest.approx((2.0, 0.65625))
    replace["config"] = {"scheduler": {"name": "klass"}, "temperature": 1.0}
    assert theory_point(replace) is None                    # memory: no exact chain


def test_summary_labels_each_theory_cell_with_its_kind():
    def record(name, options, temperature):
        r = _record(name, "replace_random", 0, 1.0, 2.0, gen_length=4, block_length=4, n=4)
        r["config"] = {"scheduler": {"name": name, **options}, "temperature": temperature}
        return r
    summary = summarize([record("low_confidence", {"tokens_per_step": 2}, 1.0),
                         record("threshold", {"threshold": 0.7}, 1.0)], theory=True)
    kinds = {c["config_key"]: c["theory_kind"] for c in summary["results"]}
    assert kinds == {"low_confidence": "closed form", "threshold": "exact enumeration"}


def test_plot_points_are_labelled_with_their_swept_values():
    from dllm_decode.eval.harness.plots import point_label

    assert point_label({"tokens_per_step": 2}, ["tokens_per_step"]) == "k=2"
    assert point_label({"threshold": 0.9, "temperature": 1.0}, ["threshold", "temperature"]) == "τ=0.9, T=1"
    assert point_label({}, []) == ""
