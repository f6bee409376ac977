"""Per-task accuracy of a trained model, with a plain greedy decoder of its own (so the recipes
do not depend on the sampler under development): low-confidence unmasking, one token per step,
or every position above a confidence threshold (at least one per step)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dllm_decode.eval.tasks import TASKS
from recipes.data import EOS_ID, MASK_ID, PAD_ID, SEP_ID, VOCAB, encode

WORDS = {i: w for w, i in VOCAB.items()}


def decode_text(ids: list[int]) -> str:
    """Space-joined words up to the first EOS."""
    out = []
    for i in ids:
        if i == EOS_ID:
            break
        out.append(WORDS.get(i, "[UNK]"))
    return " ".join(out)


def left_pad(prompts: list[list[int]]) -> tuple[Tensor, Tensor]:
    """(B, P) ids left-padded with PAD to the longest prompt, and the (B, P) 0/1 attention mask."""
    p = max(len(x) for x in prompts)
    ids = torch.tensor([[PAD_ID] * (p - len(x)) + x for x in prompts])
    mask = torch.arange(p) >= torch.tensor([p - len(x) for x in prompts])[:, None]
    return ids, mask.long()


@torch.inference_mode()
def diffusion_generate(model: nn.Module, prompts: list[list[int]], gen_length: int,
                       threshold: float | None = None) -> tuple[list[list[int]], int]:
    """Greedy low-confidence decoding of a `[left pad][prompt][canvas]` batch.

    Args:
        prompts: token ids per row.
        gen_length: canvas length G.
        threshold: None commits the single most confident masked position per step; a float
            commits every masked position whose confidence exceeds it (and at least one).
    Returns:
        The canvases (B lists of G ids) and the number of forward passes.
    """
    prompt_ids, prompt_mask = left_pad(prompts)
    batch, p = prompt_ids.shape
    x = torch.cat([prompt_ids, torch.full((batch, gen_length), MASK_ID)], 1)
    attn = torch.cat([prompt_mask, torch.ones(batch, gen_length, dtype=torch.long)], 1)
    nfe = 0
    while (masked := x[:, p:] == MASK_ID).any():
        logits = model(x, attention_mask=attn)[:, p:].float()
        nfe += 1
        logits[..., MASK_ID] = torch.finfo(logits.dtype).min     # never commit a [MASK]
        conf, cand = logits.softmax(-1).max(-1)
        conf = torch.where(masked, conf, -torch.inf)
        best = torch.zeros_like(masked).scatter_(1, conf.argmax(1, keepdim=True), True) & masked
        commit = best if threshold is None else best | (conf > threshold)
        x[:, p:] = torch.where(commit, cand, x[:, p:])
    return x[:, p:].tolist(), nfe


@torch.inference_mode()
def causal_generate(model: nn.Module, prompts: list[list[int]], max_new_tokens: int = 40
                    ) -> list[list[int]]:
    """Greedy AR decoding of `prompt =` (HF `generate`, left padding)."""
    ids, mask = left_pad([x + [SEP_ID] for x in prompts])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    return out[:, ids.shape[1]:].tolist()


def accuracy_by_task(generate, n_per_task: int, seed: int = 0, lengths: tuple[int, int] | None = None,
                     chunk: int = 64) -> dict[str, float]:
    """Percent accuracy per test-split task; `generate(prompt_ids) -> output ids per row`."""
    result = {}
    for name, task in TASKS.items():
        examples = task.examples("test", n_per_task, seed,
                                 lengths=lengths if name not in ("latin_square", "sudoku") else None)
        outputs: list[list[int]] = []
        for start in range(0, len(examples), chunk):
            outputs += generate([encode(e.prompt) for e in examples[start:start + chunk]])
        scores = [task.score(e, decode_text(o)) for e, o in zip(examples, outputs)]
        result[name] = 100 * sum(scores) / len(scores)
    result["mean"] = sum(result.values()) / len(result)
    return result
