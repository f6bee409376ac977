"""Train the embedded masked diffusion LM (LLaDA architecture) on the task mix.

    python -m recipes.dllm --out /tmp/dllm_run [--steps N] [--resume] [--init embedded]

Objective: LLaDA SFT. Each row is `[left pad][prompt][answer, EOS-padded to the canvas]`; a time
t ~ U(eps, 1) per row masks each canvas token with probability t (the prompt never); the loss is
cross-entropy on masked tokens weighted 1/t, divided by the canvas length. Most batches use the
native canvas (longest answer + EOS + 0-8 extra); every `--long-every`-th batch uses a canvas of
up to 520 tokens with fewer rows, so the model also behaves at generation lengths 256 and 512.
The final weights land in `<out>/model` (config.json, model.safetensors, tokenizer files).

Mix options (see `data.build_pool`): `--symbol-share` lists the Latin symbols instead of names in
that share of the list ops' examples (so the model learns to move those tokens by position),
`--latin-weight` scales the Latin-square examples, `--latin-target canonical` trains the one
cyclic square in prompt order. `--init` continues from trained weights of the same shape (e.g.
`embedded`, the shipped model) with a fresh optimizer and schedule.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dllm_decode.models.checkpoint import load_state_strict, read_config, read_safetensors, resolve_model_dir
from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM
from dllm_decode.eval.tasks.tokenizer import save_tokenizer
from recipes.data import (EOS_ID, LATIN_TARGETS, MASK_ID, PAD_ID, VOCAB, Pool, build_pool,
                                diffusion_batch, step_rng)
from recipes.evaluate import accuracy_by_task, diffusion_generate
from recipes.loop import (CHECKPOINT, LoopConfig, add_run_arguments,
                          load_checkpoint, run_summary, train, write_summary)

SIZES = {
    "embedded": dict(d_model=192, n_heads=6, n_layers=4, mlp_hidden_size=512),
    "tiny": dict(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64),
}
LONG_CANVAS = (32, 520)
LONG_TOKENS = 2800
"""Token budget of a long-canvas batch (rows = budget // row length, at least 2)."""


def model_config(size: str) -> LLaDAConfig:
    return LLaDAConfig(**SIZES[size], vocab_size=len(VOCAB), max_sequence_length=1024,
                       rope_theta=10000.0, mask_token_id=MASK_ID, eos_token_id=EOS_ID,
                       pad_token_id=PAD_ID)


def diffusion_loss(model: LLaDAModelLM, pool: Pool, step: int, seed: int, batch_size: int,
                   long_every: int, semi_ar_share: float = 0.0) -> torch.Tensor:
    """The LLaDA SFT loss of step `step`'s batch (a pure function of seed and step)."""
    rng, gen = step_rng(seed, step)
    canvas, rows = None, batch_size
    if long_every and step % long_every == long_every - 1:
        canvas = rng.randint(*LONG_CANVAS)
        rows = max(2, LONG_TOKENS // (canvas + 16))
    batch = diffusion_batch(pool, rows, canvas, rng, gen, semi_ar_share=semi_ar_share)
    logits = model(batch.input_ids, attention_mask=batch.attention_mask)
    ce = F.cross_entropy(logits[batch.masked], batch.targets[batch.masked], reduction="none")
    return (ce * batch.weight[batch.masked]).sum() / rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, steps=5000, batch_size=64)
    parser.add_argument("--size", choices=sorted(SIZES), default="embedded")
    parser.add_argument("--long-every", type=int, default=3, help="0 disables long canvases")
    parser.add_argument("--semi-ar-share", type=float, default=0.5,
                        help="share of rows masked as semi-AR decoding sees them (0: LLaDA SFT only)")
    parser.add_argument("--latin-target", choices=LATIN_TARGETS, default="shuffled",
                        help="Latin-square answer trained on (see data.build_pool; scoring accepts any square)")
    parser.add_argument("--symbol-share", type=float, default=0.0,
                        help="share of the list ops' examples (sort excepted) listing Latin symbols, not names")
    parser.add_argument("--latin-weight", type=float, default=1.0,
                        help="Latin-square examples in the pool, as a multiple of --pool-per-task")
    parser.add_argument("--init", default=None,
                        help="start from these weights (`embedded` or a model directory of the same size)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--export-only", action="store_true",
                        help="export <out>/checkpoint.pt to <out>/model (e.g. mid-run) and exit")
    args = parser.parse_args(argv)
    if args.export_only:
        model = LLaDAModelLM(model_config(args.size))
        state = load_checkpoint(args.out / CHECKPOINT)
        model.load_state_dict(state["model"])
        export(model, args.out / "model")
        print(f"exported step {state['step']} to {args.out / 'model'}")
        return

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)                  # parameter init only; batches use step_rng
    pool = build_pool(args.pool_per_task, args.seed, latin_target=args.latin_target,
                      symbol_share=args.symbol_share, latin_weight=args.latin_weight)
    model = initial_model(args.size, args.init)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.2f}M parameters, pool of {len(pool)} train examples", flush=True)
    cfg = LoopConfig(steps=args.steps, lr=args.lr, warmup=min(200, args.steps // 10 + 1))
    began = time.monotonic()
    losses = train(model, lambda step: diffusion_loss(model, pool, step, args.seed, args.batch_size,
                                                      args.long_every, args.semi_ar_share),
                   cfg, args.out, resume=args.resume, max_minutes=args.max_minutes)
    export(model, args.out / "model")
    summary = {"parameters": n_params, "steps": args.steps, "steps_done": len(losses),
               "latin_target": args.latin_target, "init": args.init, "lr": args.lr,
               "symbol_share": args.symbol_share, "latin_weight": args.latin_weight,
               "long_every": args.long_every, "semi_ar_share": args.semi_ar_share,
               **run_summary(losses, began)}
    if args.eval_n:
        summary["accuracy"] = evaluate(model, args.eval_n)
    write_summary(args.out, summary)


def initial_model(size: str, init: str | None) -> LLaDAModelLM:
    """A fresh `size` model, or the weights saved in `init` (`embedded` or a directory), whose
    config must equal `size`'s (saved bfloat16 weights are upcast to float32)."""
    model = LLaDAModelLM(model_config(size))
    if init is None:
        return model
    directory = resolve_model_dir(init)
    if LLaDAConfig.from_dict(read_config(directory)) != model.config:
        raise SystemExit(f"--init {init}: its config differs from --size {size} ({SIZES[size]})")
    state = {k: v.float() for k, v in read_safetensors(directory).items()}
    load_state_strict(model, state, directory)
    return model


def export(model: LLaDAModelLM, directory: Path) -> None:
    """Weights in bfloat16 (half the bytes; `load_model` upcasts to float32) plus tokenizer."""
    model.save_pretrained(directory, dtype=torch.bfloat16)
    save_tokenizer(directory)


def evaluate(model: LLaDAModelLM, n_per_task: int) -> dict[str, dict[str, float]]:
    """Accuracy at the native canvas (one token per step) and at 256/512 (threshold 0.9)."""
    model.eval()
    runs = {"native32_k1": (32, None), "native32_t0.9": (32, 0.9),
            "len256_t0.9": (256, 0.9), "len512_t0.9": (512, 0.9)}
    return {name: accuracy_by_task(lambda prompts: diffusion_generate(model, prompts, g, thr)[0],
                                   n_per_task)
            for name, (g, thr) in runs.items()}


if __name__ == "__main__":
    main()
