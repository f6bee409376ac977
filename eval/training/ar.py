"""Train the embedded autoregressive target and draft models (transformers Llama format).

    python -m eval.training.ar --out /tmp/ar_target --size target [--steps N] [--resume]
    python -m eval.training.ar --out /tmp/ar_draft --size draft

Format: `prompt = answer EOS` (`=` is the tokenizer's separator); next-token cross-entropy on the
answer and EOS only. The draft costs under a quarter of the target's compute per token. The
final model lands in `<out>/model` (`save_pretrained` + tokenizer files), loadable with
`AutoModelForCausalLM.from_pretrained`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eval.tokenizer import AR_CHAT_TEMPLATE, save_tokenizer
from eval.training.data import EOS_ID, PAD_ID, VOCAB, Pool, build_pool, causal_batch, step_rng
from eval.training.evaluate import accuracy_by_task, causal_generate
from eval.training.loop import LoopConfig, add_run_arguments, train

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
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    pool = build_pool(args.pool_per_task, args.seed)
    model = LlamaForCausalLM(model_config(args.size))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.size}: {n_params / 1e6:.2f}M parameters, pool of {len(pool)}", flush=True)
    cfg = LoopConfig(steps=args.steps, lr=args.lr, warmup=min(200, args.steps // 10 + 1))
    began = time.monotonic()
    losses = train(model, lambda step: causal_loss(model, pool, step, args.seed, args.batch_size),
                   cfg, args.out, resume=args.resume, max_minutes=args.max_minutes)
    export(model, args.out / "model")
    summary = {"size": args.size, "parameters": n_params, "steps": args.steps,
               "train_minutes": (time.monotonic() - began) / 60,
               "loss_first_100": sum(losses[:100]) / len(losses[:100]),
               "loss_last_100": sum(losses[-100:]) / len(losses[-100:])}
    if args.eval_n:
        summary["accuracy"] = {"greedy": accuracy_by_task(
            lambda prompts: causal_generate(model, prompts), args.eval_n)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2), flush=True)


def export(model: LlamaForCausalLM, directory: Path) -> None:
    """bfloat16 weights (half the bytes) with `torch_dtype` float32 recorded for loading,
    plus the tokenizer files."""
    model.to(torch.bfloat16).save_pretrained(directory)
    model.to(torch.float32)
    save_tokenizer(directory, chat_template=AR_CHAT_TEMPLATE)


if __name__ == "__main__":
    main()
