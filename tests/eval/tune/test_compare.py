"""The side-by-side table: NFE at equal accuracy is paired on the reference's prompts, PB80 is
interpolated along a sweep, the coupling ratio separates adaptive from fixed schedules."""

from __future__ import annotations

import pytest

from dllm_decode.eval.tune.compare import render, side_by_side


def rows(label, key, params, scores, nfe, tasks=("copy", "shuffle"), tokens=4):
    out = []
    for task in tasks:
        for i, score in enumerate(scores):
            n = nfe[task] if isinstance(nfe, dict) else nfe
            out.append({"task": task, "index": i, "group": label, "label": label, "config_key": key,
                        "params": params, "swept": ["threshold"] if params else [], "score": score, "nfe": n,
                        "answer_tokens_per_step": tokens / n, "tokens_per_step": 32 / n})
    return out


def test_nfe_at_equal_accuracy_pb80_and_coupling():
    records = (rows("low_confidence", "ref", {}, [1, 1, 1, 0], 4)
               + rows("threshold", "t9", {"threshold": 0.9}, [1, 1, 1, 0], {"copy": 1, "shuffle": 4})
               + rows("threshold", "t5", {"threshold": 0.5}, [1, 0, 0, 0], 1)
               + rows("fixed", "f", {}, [1, 1, 0, 0], 2))
    table = side_by_side(records)
    by_rule = {row["rule"]: row for row in table["rules"]}
    assert by_rule["threshold"]["nfe_at_equal_accuracy"] == pytest.approx(2.5)       # 0.9 holds 75%, 0.5 does not
    assert by_rule["threshold"]["at"] == {"threshold": 0.9}
    assert by_rule["fixed"]["nfe_at_equal_accuracy"] is None                           # 50% < 75% - 1
    assert by_rule["threshold"]["coupling_ratio"] == pytest.approx(4.0)                # 4 forwards vs 1 per token
    assert by_rule["fixed"]["coupling_ratio"] == pytest.approx(1.0)
    assert by_rule["threshold"]["pb80"] == 0.0 and by_rule["threshold"]["nfe_at_equal_accuracy_per_task"]["copy"] == 1
    assert "| threshold | 2 | 8 | 75.0 |" in render(table, "cmd")
    with pytest.raises(ValueError, match="no low_confidence run"):
        side_by_side(rows("threshold", "t9", {"threshold": 0.9}, [1], 1))
