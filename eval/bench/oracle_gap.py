"""What the oracle knows that confidence rules miss, read from one-token-per-step traces.

The Learn2PD oracle commits a position as soon as its candidate equals the final token. So the
steps it saves are the steps a token spends already correct but still masked. For every answer
token of a traced decode this module measures how many consecutive steps, ending at its commit,
its candidate was already the final token ("correct but waiting"), and the confidence it had when
that run began (the bar a threshold rule would have needed then). It also collects the
confidence of every wrong candidate seen: a threshold rule can only be as low as the confident
mistakes allow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from dllm_decode.config import DecodeResult


def token_waits(result: DecodeResult, eos_ids: Sequence[int]) -> dict[str, list]:
    """Per answer token of a traced `DecodeResult`: waits, start confidences, wrong confidences.

    Args:
        result: from `generate(..., trace=True)`.
        eos_ids: the model's end-of-text ids; tokens after the first are not answer tokens.
    Returns:
        `{"rows": row of each answer token, "wait": steps correct before the commit step,
        "start_confidence": confidence when the final correct run began, "commit_confidence":
        confidence at commit, "wrong_confidence": [(row, confidence) of every eligible wrong
        candidate at every step]}`.
    """
    if not result.trace:
        raise ValueError("token_waits needs a result decoded with trace=True")
    final = result.tokens                                            # (B, G)
    batch, gen = final.shape
    steps = len(result.trace)
    candidate = torch.full((steps, batch, gen), -1, dtype=torch.long)
    confidence = torch.full((steps, batch, gen), float("-inf"))
    commit_step = torch.full((batch, gen), -1, dtype=torch.long)
    for s, entry in enumerate(result.trace):
        rows, offset = entry["rows"], entry["offset"]
        width = min(entry["tokens"].shape[1], gen - offset)
        cols = torch.arange(offset, offset + width)
        tokens, conf = entry["tokens"][:, :width], entry["confidence"][:, :width]
        committed = entry["commit"][:, :width]
        eligible = conf > float("-inf")
        r, c = torch.meshgrid(rows, cols, indexing="ij")
        candidate[s, r[eligible], c[eligible]] = tokens[eligible]
        confidence[s, r[eligible], c[eligible]] = conf[eligible]
        first = committed & (commit_step[r, c] < 0)
        commit_step[r[first], c[first]] = s
    is_eos = torch.isin(final, torch.tensor(tuple(eos_ids)))
    answer_end = torch.where(is_eos.any(-1), is_eos.int().argmax(-1) + 1, gen)   # include the EOS
    out: dict[str, list] = {"rows": [], "wait": [], "start_confidence": [], "commit_confidence": [],
                            "wrong_confidence": []}
    correct = candidate == final.unsqueeze(0)                          # (S, B, G)
    wrong = (candidate >= 0) & ~correct
    for b in range(batch):                          # analysis, not the decode loop
        for p in range(int(answer_end[b])):
            step = int(commit_step[b, p])
            if step < 0:
                continue
            start = step
            while start > 0 and bool(correct[start - 1, b, p]):
                start -= 1
            out["rows"].append(b)
            out["wait"].append(step - start)
            out["start_confidence"].append(float(confidence[start, b, p]))
            out["commit_confidence"].append(float(confidence[step, b, p]))
        mistakes = confidence[:, b][wrong[:, b]]
        out["wrong_confidence"] += [(b, float(x)) for x in mistakes.tolist()]
    return out


def add_chunk(groups: dict[str, dict[str, list]], result: DecodeResult, tasks: Sequence[str],
              eos_ids: Sequence[int]) -> None:
    """Add one traced chunk's `token_waits` to `groups` (task -> lists), by the task of each row."""
    waits = token_waits(result, eos_ids)

    def group(row: int) -> dict[str, list]:
        return groups.setdefault(tasks[row], {"wait": [], "start_confidence": [], "wrong_confidence": []})

    for row, wait, start in zip(waits["rows"], waits["wait"], waits["start_confidence"]):
        group(row)["wait"].append(wait)
        group(row)["start_confidence"].append(start)
    for row, value in waits["wrong_confidence"]:
        group(row)["wrong_confidence"].append(value)


def summarize(groups: dict[str, dict[str, list]]) -> dict[str, dict[str, Any]]:
    """Per task: mean and max wait, quantiles of the confidence at the start of the final correct
    run (a threshold at the p10 would have caught 90% of tokens then), and of wrong candidates (a
    threshold below their max commits a mistake somewhere)."""
    out = {}
    for task, lists in groups.items():
        wait, start, wrong = lists["wait"], lists["start_confidence"], lists["wrong_confidence"]
        if not wait:
            continue
        out[task] = {
            "answer_tokens": len(wait),
            "mean_wait_steps": sum(wait) / len(wait),
            "max_wait_steps": max(wait),
            "start_confidence_p10": _quantile(start, 0.1),
            "start_confidence_median": _quantile(start, 0.5),
            "wrong_candidates": len(wrong),
            "wrong_confidence_p90": _quantile(wrong, 0.9),
            "wrong_confidence_max": max(wrong) if wrong else None,
        }
    return out


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(torch.tensor(values, dtype=torch.float64).quantile(q))
