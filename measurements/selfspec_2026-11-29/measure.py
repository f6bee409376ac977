"""Self-speculative decoders (S2D2, PSD, SimSD) beside single-model rules on `embedded-bd`.

Every row decodes the same task prompts (the task suite's test split, `per_task` per task, in the
chat template), gen length 32, greedy, batches of 32. Per row: accuracy (pooled, with a 95% Wilson
interval, and the mean over tasks), forwards per answer token (sum of NFE over answer tokens up to
the first end-of-text, with a 95% bootstrap interval over prompts), canvas rows per answer token,
and the share of forwards that verified. Single-model rules run through `generate` with the exact
`block` cache; the self-speculative decoders recompute the canvas (same forward count, `blockrun`).

Usage: python measure.py OUT_DIR [per_task] [kinds] [label part]   (writes rows.jsonl,
samples.jsonl, summary.json; `kinds`: comma-separated row kinds to run, e.g. `s2d2,simsd`, default
all; `label part`: only rows whose label contains it)
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.eval.bench.subject import task_samples
from dllm_decode.eval.tasks import TASKS
from dllm_decode.models.loading import load_model
from dllm_decode.prompts import chat_prompt
from dllm_decode.registry import component
from dllm_decode.sampler import generate
from dllm_decode.speculative.self_decoders import ar_mode_generate

BATCH = 32


def rule(name: str, **options):
    return component("scheduler", {"name": name, **options})


def rows():
    """label -> (kind, decoder options or None, scheduler, block length)."""
    out = {}
    for tau in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99):
        out[f"threshold {tau} +block"] = ("generate", None, rule("threshold", threshold=tau), 8)
    out["threshold 0.9 +block, block 4"] = ("generate", None, rule("threshold", threshold=0.9), 4)
    out["low_confidence 1/step +block"] = ("generate", None, rule("low_confidence", steps_per_block=8), 8)
    for factor in (1.0, 2.0, 3.0):
        out[f"factor {factor} +block"] = ("generate", None, rule("factor", factor=factor), 8)
    for gamma in (0.1, 0.5, 1.0):
        out[f"eb {gamma} +block"] = ("generate", None, rule("eb", gamma=gamma), 8)
    out["AR mode (block size 1)"] = ("ar_mode", None, rule("threshold"), 8)
    # most informative first (the shared machine may not finish the list)
    psd = [(4, 0.9), (4, 0.8), (4, 0.7), (8, 0.9), (2, 0.9), (4, 0.95), (8, 0.8), (8, 0.7)]
    strict_psd = {f"psd strict K={k} on threshold {tau}": ("psd", {"draft_steps": k}, rule("threshold", threshold=tau), 8)
                  for k, tau in psd}
    lenient = {f"psd lenient K=4 on threshold {tau}": ("psd", {"draft_steps": 4, "acceptance": "lenient"},
                                                       rule("threshold", threshold=tau), 8) for tau in (0.9, 0.7)}
    published = {"mode": "published"}
    t09 = rule("threshold", threshold=0.9)
    spec = {
        "s2d2 strict, block 8": ("s2d2", {}, t09, 8),
        "s2d2 published Config-A (sub-block 4, hysteresis 1/-5, tau 0.9)": ("s2d2", published, t09, 4),
        "simsd strict (draft threshold 0.9)": ("simsd", {}, t09, 8),
        "simsd published greedy_match (draft threshold 0.9)": ("simsd", {"mode": "published"}, t09, 8),
        "s2d2 published Config-C (min span 8, block 8)": ("s2d2", {**published, "policy": "mask_span_length", "min_span": 8}, t09, 8),
        "simsd published mrs (draft threshold 0.9)": ("simsd", {"mode": "published", "acceptance": "mrs"}, t09, 8),
        "s2d2 published always-verify, block 8": ("s2d2", {**published, "policy": "always"}, t09, 8),
        "s2d2 published Config-A, block 8": ("s2d2", published, t09, 8),
        "s2d2 strict, block 4": ("s2d2", {}, t09, 4),
        "simsd strict (draft threshold 0.7)": ("simsd", {}, rule("threshold", threshold=0.7), 8),
        "simsd published greedy_match, block 4": ("simsd", {"mode": "published"}, t09, 4),
        "s2d2 published Config-A on threshold 0.7": ("s2d2", published, rule("threshold", threshold=0.7), 4),
    }
    first = dict(list(strict_psd.items())[:1]) | dict(list(lenient.items())[:1])
    out.update(first)
    out.update({k: v for k, v in strict_psd.items() if k not in first})
    out.update({k: v for k, v in lenient.items() if k not in first})
    out["psd strict K=4 on low_confidence 1/step"] = ("psd", {"draft_steps": 4}, rule("low_confidence", steps_per_block=8), 8)
    out.update(spec)
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100 * (centre - half), 100 * (centre + half)


def bootstrap_ratio(num: list[int], den: list[int], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    n = len(num)
    values = []
    for _ in range(draws):
        pick = [rng.randrange(n) for _ in range(n)]
        values.append(sum(num[i] for i in pick) / max(1, sum(den[i] for i in pick)))
    values.sort()
    return values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


def decode(model, kind, options, scheduler, block, prompts):
    cache = component("cache", "block") if kind == "generate" else component("cache", "none")
    config = DecodeConfig(scheduler=scheduler, cache=cache, gen_length=32, block_length=block)
    texts, nfe, rows_, answer, verifies, fed = [], [], [], [], [], []
    for i in range(0, len(prompts), BATCH):
        chunk = prompts[i:i + BATCH]
        if kind == "generate":
            result, ver, tokens = generate(model, chunk, config), None, None
        elif kind == "ar_mode":
            out = ar_mode_generate(model, chunk, config)
            result, ver, tokens = out.result, out.verifies, out.tokens_fed
        else:
            decoder = component("self_decoder", {"name": kind, **options})
            out = decoder.decode(model, chunk, config, generator=torch.Generator().manual_seed(i))
            result, ver, tokens = out.result, out.verifies, out.tokens_fed
        texts += result.text
        nfe += result.nfe.tolist()
        rows_ += result.forward_rows.tolist()
        answer += result.answer_lengths.tolist()
        verifies += ver.tolist() if ver is not None else [0] * len(chunk)
        fed += tokens.tolist() if tokens is not None else [0] * len(chunk)
    return texts, nfe, rows_, answer, verifies, fed


def main() -> None:
    out_dir = Path(sys.argv[1])
    per_task = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    kinds = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
    only = sys.argv[4] if len(sys.argv) > 4 else ""           # rows whose label contains it
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = load_model("embedded-bd")
    samples = task_samples(TASKS, per_task, seed=0)
    prompts = [chat_prompt(model.tokenizer, s.example.prompt) for s in samples]
    summary = []
    with open(out_dir / "rows.jsonl", "w") as rows_file, open(out_dir / "samples.jsonl", "w") as sample_file:
        for label, (kind, options, scheduler, block) in rows().items():
            if (kinds is not None and kind not in kinds) or only not in label:
                continue
            started = time.perf_counter()
            texts, nfe, rows_, answer, verifies, fed = decode(model, kind, options, scheduler, block, prompts)
            seconds = time.perf_counter() - started
            correct = [TASKS[s.task].score(s.example, t) for s, t in zip(samples, texts)]
            by_task: dict[str, list[float]] = {}
            for s, c in zip(samples, correct):
                by_task.setdefault(s.task, []).append(c)
            k = int(sum(correct))
            lo, hi = wilson(k, len(correct))
            f_lo, f_hi = bootstrap_ratio(nfe, answer)
            row = {"label": label, "kind": kind, "options": options, "scheduler": repr(scheduler), "block_length": block,
                   "n": len(correct), "correct": k, "accuracy": 100 * k / len(correct), "accuracy_95": [lo, hi],
                   "accuracy_task_mean": 100 * sum(sum(v) / len(v) for v in by_task.values()) / len(by_task),
                   "forwards_per_answer_token": sum(nfe) / max(1, sum(answer)), "fpat_95": [f_lo, f_hi],
                   "rows_per_answer_token": sum(rows_) / max(1, sum(answer)),
                   "verify_share": sum(verifies) / max(1, sum(nfe)), "nfe_total": sum(nfe),
                   "tokens_fed_per_answer_token": sum(fed) / max(1, sum(answer)) if any(fed) else None,
                   "answer_tokens": sum(answer), "seconds": seconds}
            rows_file.write(json.dumps(row) + "\n")
            rows_file.flush()
            for i, (s, t) in enumerate(zip(samples, texts)):
                sample_file.write(json.dumps({"label": label, "i": i, "task": s.task, "text": t, "correct": correct[i],
                                              "nfe": nfe[i], "rows": rows_[i], "answer": answer[i]}) + "\n")
            sample_file.flush()
            summary.append(row)
            print(f"{label:60s} acc {row['accuracy']:5.1f} [{lo:4.1f},{hi:4.1f}]  fpat {row['forwards_per_answer_token']:.3f} "
                  f"[{f_lo:.3f},{f_hi:.3f}]  rows/at {row['rows_per_answer_token']:.3f}  {seconds:.0f}s", flush=True)
    (out_dir / "summary.json").write_text(json.dumps({"per_task": per_task, "n": len(prompts), "gen_length": 32,
                                                      "model": "embedded-bd", "rows": summary}, indent=1))


if __name__ == "__main__":
    main()
