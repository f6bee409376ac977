"""Train the embedded autoregressive target and draft models (transformers Llama format).

    python -m recipes.ar --out /tmp/ar_target --size target [--steps N] [--resume]
    python -m recipes.ar --out /tmp/ar_draft --size draft
    python -m recipes.ar --out /tmp/ar_distilled --size draft --teacher ar_target --init ar_draft

`--teacher` distils: the answers trained on are the teacher's greedy outputs for the pool's
prompts instead of the references (sequence-level knowledge distillation, as DistillSpec, Zhou et
al. 2023, arXiv 2310.08461, recommends for speculative drafts: a draft that imitates its target is
accepted more often, most of all on tasks with many valid answers, where the references pick one
at random and the target picks its own). `--init` starts from a trained model's weights.

Format: `prompt = answer EOS` (`=` is the tokenizer's separator); next-token cross-entropy on the
answer and EOS only. The draft costs under a quarter of the target's compute per token. The
final model lands in `<out>/model` (`save_pretrained` + tokenizer files), loadable with
`AutoModelForCausalLM.from_pretrained`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dllm_decode.models.causal import load_causal_lm, resolve_causal_dir
from dllm_decode.eval.tasks.tokenizer import AR_CHAT_TEMPLATE, save_tokenizer
from recipes.data import EOS_ID, PAD_ID, VOCAB, Pool, build_pool, causal_batch, step_rng
from recipes.evaluate import accuracy_by_task, causal_generate
from recipes.loop import (LoopConfig, add_run_arguments, run_summary, train,
                                            write_summary)

SIZES = {
    "target": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=6,
                   intermediate_size=512),
    "draft": dict(hidden_size=96, num_hidden_layers=2, num_attention_heads=3,
                  intermediate_size=256),
    "draft1": dict(hidden_size=96, num_hidden_layers=1, num_attention_heads=3,
                   intermediate_size=256),       # a cheaper draft: forwards cost per layer here
    "tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
}


def model_config(size: str) -> LlamaConfig:
    return LlamaConfig(**SIZES[size], vocab_size=len(VOCAB), max_position_embeddings=1024,
                       rope_theta=10000.0, tie_word_embeddings=False, pad_token_id=PAD_ID,
                       bos_token_id=EOS_ID, eos_token_id=EOS_ID)


def causal_loss(model: LlamaForCausalLM, pool: Pool, step: int, seed: int,
                batch_size: int) -> torch.Tensor:
    """Next-token loss of step `step`'s batch (a pure function of seed and step)."""
    rng, _ = step_rng(seed, step)
    batch = causal_batch(pool, batch_size, rng)
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                 labels=batch.labels).loss


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, steps=2500, batch_size=48)
    parser.add_argument("--size", choices=sorted(SIZES), default="target")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--teacher", default=None,
                        help="train on this causal LM's greedy answers (e.g. ar_target): distillation")
    parser.add_argument("--init", default=None, help="start from this causal LM's weights (e.g. ar_draft)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    pool = build_pool(args.pool_per_task, args.seed)
    if args.teacher:
        pool = distilled(pool, load_causal_lm(args.teacher))
    model = initial_model(args.size, args.init)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.size}: {n_params / 1e6:.2f}M parameters, pool of {len(pool)}", flush=True)
    cfg = LoopConfig(steps=args.steps, lr=args.lr, warmup=min(200, args.steps // 10 + 1))
    began = time.monotonic()
    losses = train(model, lambda step: causal_loss(model, pool, step, args.seed, args.batch_size),
                   cfg, args.out, resume=args.resume, max_minutes=args.max_minutes)
    export(model, args.out / "model")
    summary = {"size": args.size, "parameters": n_params, "steps": args.steps,
               "teacher": args.teacher, "init": args.init,
               **run_summary(losses, began)}
    if args.eval_n:
        summary["accuracy"] = {"greedy": accuracy_by_task(
            lambda prompts: causal_generate(model, prompts), args.eval_n)}
    write_summary(args.out, summary)


def distilled(pool: Pool, teacher: Any, chunk: int = 512) -> Pool:
    """`pool` with every answer replaced by the teacher's greedy answer (up to its first EOS)."""
    answers: list[list[int]] = []
    began = time.monotonic()
    with torch.inference_mode():
        for start in range(0, len(pool), chunk):
            for out in causal_generate(teacher, pool.prompts[start:start + chunk]):
                answers.append(out[:out.index(EOS_ID)] if EOS_ID in out else out)
            if start // chunk % 40 == 0:
                print(f"teacher answers {len(answers)}/{len(pool)} "
                      f"({time.monotonic() - began:.0f} s)", flush=True)
    changed = sum(a != b for a, b in zip(answers, pool.answers))
    print(f"teacher answers differ from the references on {changed}/{len(pool)}", flush=True)
    return Pool(pool.prompts, answers)


def initial_model(size: str, init: str | None) -> LlamaForCausalLM:
    """A fresh `size` model, or the weights of `init` (which must have that size's shape)."""
    if init is None:
        return LlamaForCausalLM(model_config(size))
    model = LlamaForCausalLM.from_pretrained(resolve_causal_dir(init), dtype=torch.float32,
                                             local_files_only=True)
    expected = model_config(size)
    shape = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "vocab_size", "tie_word_embeddings")
    if any(getattr(model.config, key) != getattr(expected, key) for key in shape):
        raise SystemExit(f"--init {init}: its shape differs from --size {size} ({SIZES[size]})")
    return model


def export(model: LlamaForCausalLM, directory: Path) -> None:
    """bfloat16 weights (half the bytes) with `torch_dtype` float32 recorded for loading,
    plus the tokenizer files."""
    model.to(torch.bfloat16).save_pretrained(directory)
    model.to(torch.float32)
    save_tokenizer(directory, chat_template=AR_CHAT_TEMPLATE)


if __name__ == "__main__":
    main()
