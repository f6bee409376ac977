"""Train the embedded uniform-noise model: a tiny DiffusionGemma trained as its decoder is used.

    python -m recipes.noise --out /tmp/noise_run [--steps N] [--resume] [--max-minutes M]

The model is transformers' own `DiffusionGemmaForBlockDiffusion` (the reference the package's
port, `dllm_decode/models/diffusion_gemma.py`, is checked against), built from a tiny config
(`tiny_config`): the embedded tokenizer's 129-token vocabulary, hidden 128, 4 layers (3 sliding,
the last full, as the family forces), 4 experts top-2 beside the dense MLP, canvas 8 (the block
of the shipped `embedded-bd`). It starts from nothing: no shipped model has this architecture.
The final model is written by transformers' `save_pretrained` (bfloat16), so both the package's
loader and `DiffusionGemmaForBlockDiffusion.from_pretrained` read it.

Objective (uniform-noise block diffusion; the decoding loop it serves is transformers 5.24
`generation_diffusion_gemma.py`, the entropy-bound sampler of arXiv 2505.24857):
  * Rows: `prompt =` then `answer EOS`, EOS-filled to whole canvases of `--canvas` tokens; one
    canvas per row, drawn uniformly among the answer's canvases.
  * The encoder (causal) reads the prompt and the clean canvases before the drawn one, left
    padded; positions are one `arange` over the batch, as the reference `generate` uses them.
  * Noise: t ~ U(0, 1] per row; each canvas token is replaced, with probability t, by a token
    drawn uniformly from the whole vocabulary (what an unaccepted column holds when decoding).
  * Self-conditioning, on every other step: a no-grad decoder pass on the same noisy canvas,
    whose logits, divided by a temperature drawn from the shipped schedule's range
    [t_min, t_max] (the loop feeds the tempered logits back), condition the graded pass.
  * Loss: mean cross-entropy over every canvas position (noised or not), predicting the clean
    canvas.
The optimisation loop, checkpoints (`--resume`), pool and `--max-minutes` are `recipes.loop`'s and
`recipes.data`'s, shared with the other recipes.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_decode.eval.tasks.tokenizer import AR_CHAT_TEMPLATE, save_tokenizer
from recipes.data import EOS_ID, PAD_ID, SEP_ID, VOCAB, Pool, build_pool, step_rng
from recipes.evaluate import left_pad
from recipes.loop import (LoopConfig, add_run_arguments, export_checkpoint, run_summary, train,
                          write_summary)

CANVAS = 8
GENERATION = dict(max_denoising_steps=16, t_min=0.4, t_max=0.8, stability_threshold=1,
                  confidence_threshold=0.005, max_new_tokens=32)
"""The decoding the model ships with (`generation_config.json`): the reference defaults, except
16 denoising steps per 8-token canvas instead of 48 per 256."""


def tiny_config(canvas: int = CANVAS, hidden: int = 128, layers: int = 4):
    """transformers' `DiffusionGemmaConfig` of the embedded noise model (a tiny vision config:
    the reference always builds a vision tower, and its default one is 167M parameters)."""
    from transformers import DiffusionGemmaConfig

    text = dict(vocab_size=len(VOCAB), hidden_size=hidden, intermediate_size=2 * hidden,
                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                head_dim=hidden // 4, global_head_dim=hidden // 4, num_global_key_value_heads=2,
                sliding_window=64, num_experts=4, top_k_experts=2, moe_intermediate_size=hidden // 2,
                max_position_embeddings=1024, eos_token_id=EOS_ID, pad_token_id=PAD_ID, bos_token_id=None,
                layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"])
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=1,
                  num_key_value_heads=1, head_dim=16, position_embedding_size=16)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas)


@dataclass(frozen=True)
class CanvasBatch:
    """One canvas per row and the committed text before it.

    Attributes:
        prefix: (B, P) prompt, `=` and the earlier clean canvases, left-padded with PAD.
        prefix_mask: (B, P) long, 0 on the padding.
        clean: (B, C) the canvas's clean tokens. noisy: (B, C) with the noised columns redrawn.
        temperature: (B,) the self-conditioning temperature of each row.
        self_condition: whether this step trains the self-conditioned pass.
    """

    prefix: Tensor
    prefix_mask: Tensor
    clean: Tensor
    noisy: Tensor
    temperature: Tensor
    self_condition: bool


def canvas_batch(pool: Pool, batch_size: int, canvas: int, step: int, seed: int) -> CanvasBatch:
    """Step `step`'s batch, a pure function of (seed, step)."""
    rng, gen = step_rng(seed, step)
    prefixes, targets = [], []
    for i in (rng.randrange(len(pool)) for _ in range(batch_size)):
        answer = pool.answers[i] + [EOS_ID]
        answer += [EOS_ID] * (-len(answer) % canvas)
        j = canvas * rng.randrange(len(answer) // canvas)
        prefixes.append(pool.prompts[i] + [SEP_ID] + answer[:j])
        targets.append(answer[j:j + canvas])
    prefix, prefix_mask = left_pad(prefixes)
    clean = torch.tensor(targets)
    t = 1 - torch.rand(batch_size, 1, generator=gen)                      # U(0, 1]
    noised = torch.rand(clean.shape, generator=gen) < t
    noisy = torch.where(noised, torch.randint(0, len(VOCAB), clean.shape, generator=gen), clean)
    low, high = GENERATION["t_min"], GENERATION["t_max"]
    temperature = low + (high - low) * torch.rand(batch_size, generator=gen)
    return CanvasBatch(prefix, prefix_mask, clean, noisy, temperature, step % 2 == 1)


def canvas_loss(model: nn.Module, batch: CanvasBatch) -> Tensor:
    """Mean cross-entropy of the decoder's clean-canvas prediction over every canvas column."""
    decoder_mask = torch.cat([batch.prefix_mask, torch.ones_like(batch.clean)], 1)
    cache = model.model.encoder(input_ids=batch.prefix, attention_mask=batch.prefix_mask).cache
    previous = None
    if batch.self_condition:
        with torch.no_grad():
            first = model(cache=cache, decoder_input_ids=batch.noisy, decoder_attention_mask=decoder_mask)
        previous = first.logits / batch.temperature[:, None, None]
    logits = model(cache=cache, decoder_input_ids=batch.noisy, decoder_attention_mask=decoder_mask,
                   self_conditioning_logits=previous).logits
    return F.cross_entropy(logits.flatten(0, 1), batch.clean.flatten())


def export(model: nn.Module, directory: Path) -> None:
    """bfloat16 weights and config by transformers' `save_pretrained`, the shipped decoding in
    `generation_config.json` (EOS and PAD set: the reference stops only at its EOS), tokenizer."""
    import copy

    from transformers.models.diffusion_gemma.generation_diffusion_gemma import \
        DiffusionGemmaGenerationConfig

    shipped = copy.deepcopy(model).to(torch.bfloat16)
    shipped.generation_config = DiffusionGemmaGenerationConfig(**GENERATION, eos_token_id=EOS_ID,
                                                               pad_token_id=PAD_ID)
    shipped.save_pretrained(str(directory))
    save_tokenizer(directory, chat_template=AR_CHAT_TEMPLATE)


def build(args: argparse.Namespace) -> nn.Module:
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(args.seed)
    return DiffusionGemmaForBlockDiffusion(tiny_config(args.canvas, args.hidden, args.layers))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, steps=6000, batch_size=32)
    parser.add_argument("--canvas", type=int, default=CANVAS)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--export-only", action="store_true",
                        help="export <out>/checkpoint.pt to <out>/model (e.g. mid-run) and exit")
    args = parser.parse_args(argv)
    if args.canvas < 1 or args.hidden % 8 or args.layers < 1:
        parser.error(f"need --canvas >= 1, --hidden a multiple of 8 and --layers >= 1; got "
                     f"{args.canvas}, {args.hidden}, {args.layers}")

    torch.set_num_threads(args.threads)
    model = build(args)
    if args.export_only:
        export_checkpoint(model, args.out, export)
        return
    pool = build_pool(args.pool_per_task, args.seed)
    n_params = sum(p.numel() for n, p in model.named_parameters() if "vision" not in n)
    print(f"{n_params / 1e6:.2f}M text parameters, canvas {args.canvas}, "
          f"pool of {len(pool)} train examples", flush=True)
    cfg = LoopConfig(steps=args.steps, lr=args.lr, warmup=min(200, args.steps // 10 + 1))
    began = time.monotonic()
    losses = train(model, lambda step: canvas_loss(model, canvas_batch(pool, args.batch_size, args.canvas,
                                                                       step, args.seed)),
                   cfg, args.out, resume=args.resume, max_minutes=args.max_minutes)
    export(model, args.out / "model")
    write_summary(args.out, {"parameters": n_params, "init": "none", "canvas": args.canvas,
                             "hidden": args.hidden, "layers": args.layers, "steps": args.steps,
                             "steps_done": len(losses), "batch_size": args.batch_size, "lr": args.lr,
                             "generation": GENERATION, **run_summary(losses, began)})


if __name__ == "__main__":
    main()
