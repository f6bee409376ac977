"""Logit error of each int4 variant against the bfloat16 model, per mask ratio.

    OMP_NUM_THREADS=1 nice -n 10 python measurements/cpu_2026-11-29_quant/mask_ratio_error.py CKPT OUT.json

For 10 test-split prompts per task (seed 0, the eval's prompts), the canvas is prompt + reference
answer with each answer token masked with probability t (seeded), t in 0.1 ... 0.9, the
training-time corruption. At the masked positions: top-1 agreement with the bfloat16 model and
mean KL(bf16 || int4), per checkpoint (`run_eval.sh` writes them to CKPT).
"""

from __future__ import annotations

import json
import sys

import torch

from dllm_decode.eval.tasks import TASKS
from dllm_decode.models import load_model

RATIOS = (0.1, 0.3, 0.5, 0.7, 0.9)
VARIANTS = ("int4-rtn", "int4-clean", "int4-decode", "int8", "fp8")


def canvases(model, per_task: int = 10):
    tok = model.tokenizer
    rows = []
    for task in TASKS.values():
        for example in task.examples("test", per_task, 0):
            prompt = tok(example.prompt)["input_ids"]
            answer = tok(" " + example.answer, add_special_tokens=False)["input_ids"]
            rows.append((prompt, answer))
    return rows


def main() -> None:
    ckpt, out_path = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    result = {"ratios": RATIOS, "prompts_per_task": 10, "tasks": len(TASKS)}
    for name in ("embedded", "embedded-bd"):
        base = load_model(name, dtype=torch.bfloat16)
        models = {v: load_model(f"{ckpt}/{name}-{v}", dtype=torch.bfloat16) for v in VARIANTS}
        rows = canvases(base)
        stats = {v: {t: [0, 0, 0.0] for t in RATIOS} for v in VARIANTS}   # agree, count, kl sum
        generator = torch.Generator().manual_seed(0)
        with torch.inference_mode():
            for prompt, answer in rows:
                ids = torch.tensor([prompt + answer])
                for t in RATIOS:
                    masked = torch.rand(len(answer), generator=generator) < t
                    if not masked.any():
                        continue
                    canvas = ids.clone()
                    where = torch.nonzero(masked).squeeze(-1) + len(prompt)
                    canvas[0, where] = base.mask_token_id
                    ref = base(canvas)[0, where].float().log_softmax(-1)
                    for v, model in models.items():
                        got = model(canvas)[0, where].float().log_softmax(-1)
                        s = stats[v][t]
                        s[0] += int((got.argmax(-1) == ref.argmax(-1)).sum())
                        s[1] += len(where)
                        s[2] += float((ref.exp() * (ref - got)).sum())
        result[name] = {v: {str(t): {"top1_agree": a / c, "kl": kl / c, "positions": c}
                            for t, (a, c, kl) in per.items()} for v, per in stats.items()}
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
