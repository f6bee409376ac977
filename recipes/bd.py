"""Train the embedded block-diffusion model: the embedded AR target converted with Fast-dLLM v2's recipe.

    python -m recipes.bd --out /tmp/bd_run [--steps N] [--resume] [--max-minutes M]

Recipe (Fast-dLLM v2, arXiv 2509.26328; `shared/specs/block-diffusion.md` §1.3 and §5):
  * Init: the shipped AR target (`embedded/ar_target`, Llama format, 1.82M parameters) with its
    weights unchanged; the mask is the tokenizer's `<|mdm_mask|>` (id 3, an embedding row the AR
    model never saw as input: the spare row of spec §5.1).
  * Rows: `prompt = answer EOS`, EOS-filled to the end of the answer's last block, right-padded
    (never attended, never scored) to the batch width; positions count from 0, so every row
    has the same block grid.
  * Noise, per block of `--block-size`: t ~ U(0, 1), p = (1 - eps) t + eps, each answer-region
    token masked with probability p; the complementary copy masks exactly the other answer
    tokens. Both go in the batch, so every answer token is a target exactly once.
  * Attention over `[x_t ; x_0]` (2n tokens, both halves at positions 0..n-1): x_t -> x_t inside
    the block, x_t -> x_0 strictly earlier blocks, x_0 -> x_0 block-causal.
  * Loss, with the token shift: row i of the x_t half is scored on the token at i + 1 where
    that token is masked in x_t; plain mean cross-entropy over those targets (no 1/t weight).

Deviations from v2, both small and stated: (1) the EOS fill of the answer's last block is a
trained target (v2's optional `pad_mask_token` pads with MASK and ignores it), so a decoder
finishes the answer's block in one step instead of guessing tokens nobody reads; (2) with
`--boundary clean` (default) the first token of each block is scored from the x_0 copy's row
before it, i.e. from the clean previous block, which is exactly what decoding sees (it commits
that token from the finished previous block, spec §1.2, whose train/infer mismatch note this
removes); `--boundary noisy` is v2 to the letter.

Block size 8 (the spec's suggestion for this suite): answers are 2-7 tokens plus EOS for the
list tasks and 16 for the grids, prompts 6-18 tokens plus `=`. A block of 8 holds a whole list
answer (often with the prompt's tail) and a grid in 2-3 blocks, so a step can commit up to 8
tokens; 4 would cap parallelism at 4 and add a block boundary (an AR-style step) every 4
tokens; 16 or 32 would be mostly EOS fill for list answers. The final model lands in
`<out>/model` (config.json `fast_dllm_llama`, bfloat16 safetensors, tokenizer with the AR
chat template `prompt =`), loadable with `dllm_decode.load_model`.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode.eval.tasks.tokenizer import AR_CHAT_TEMPLATE, save_tokenizer
from recipes.data import (EOS_ID, MASK_ID, PAD_ID, SEP_ID, Pool, build_pool,
                                            step_rng)
from recipes.evaluate import accuracy_by_task, left_pad
from recipes.loop import (LoopConfig, add_run_arguments, export_checkpoint, run_summary, train,
                          write_summary)
from dllm_decode.models.checkpoint import read_config, read_safetensors
from dllm_decode.models.fast_dllm import FastDLLMLlamaConfig, FastDLLMModel
from dllm_decode.models.layers import default_positions, rope_tables

BOUNDARY_RULES = ("clean", "noisy")
EPS = 1e-3


def converted(init_dir: Path, block_size: int) -> FastDLLMModel:
    """The AR model in `init_dir` (transformers Llama layout) as a block-diffusion model: same
    weights, `bd_size` and the mask id added to its config (spec §5.1-5.2)."""
    config = read_config(init_dir)
    if config.get("model_type") != "llama":
        raise SystemExit(f"--init {init_dir}: expected a transformers Llama checkpoint, "
                         f"got model_type {config.get('model_type')!r}")
    if MASK_ID >= config["vocab_size"]:
        raise SystemExit(f"--init {init_dir}: the mask id {MASK_ID} is outside its vocabulary")
    cfg = FastDLLMLlamaConfig.from_dict({**config, "bd_size": block_size, "mask_token_id": MASK_ID,
                                         "eos_token_id": EOS_ID, "pad_token_id": PAD_ID})
    model = FastDLLMModel(cfg)
    state = {k: v.float() for k, v in read_safetensors(init_dir).items()}
    model.load_state_dict(state, strict=True)
    return model


@dataclass(frozen=True)
class BlockBatch:
    """Rows `prompt = answer EOS [EOS fill]` and their complementary noisy copies, (R, n) each.

    Attributes:
        clean: x_0, right-padded with PAD. noisy: x_t (masked tokens replaced by MASK).
        real: not padding. masked: masked in x_t (the targets of the shifted loss).
    """

    clean: Tensor
    noisy: Tensor
    real: Tensor
    masked: Tensor


def block_batch(pool: Pool, batch_size: int, block: int, step: int, seed: int) -> BlockBatch:
    """Step `step`'s batch (a pure function of seed and step): `batch_size` examples, 2x rows."""
    rng, gen = step_rng(seed, step)
    rows, starts = [], []
    for i in (rng.randrange(len(pool)) for _ in range(batch_size)):
        prompt, answer = pool.prompts[i] + [SEP_ID], pool.answers[i] + [EOS_ID]
        fill = -(len(prompt) + len(answer)) % block
        rows.append(prompt + answer + [EOS_ID] * fill)
        starts.append(len(prompt))
    width = max(len(r) for r in rows)
    clean = torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])
    col = torch.arange(width)
    real = col < torch.tensor([len(r) for r in rows])[:, None]
    answer = real & (col >= torch.tensor(starts)[:, None])
    t = torch.rand(batch_size, width // block, generator=gen).repeat_interleave(block, dim=1)
    first = (torch.rand(batch_size, width, generator=gen) < (1 - EPS) * t + EPS) & answer
    masked = torch.cat([first, answer & ~first])              # the complementary copy
    clean, real = torch.cat([clean, clean]), torch.cat([real, real])
    return BlockBatch(clean, torch.where(masked, MASK_ID, clean), real, masked)


def training_mask(real: Tensor, block: int) -> Tensor:
    """(R, 1, 2n, 2n) bool over `[x_t ; x_0]` (v2 `block_diff_mask`): x_t -> x_t same block,
    x_t -> x_0 strictly earlier blocks, x_0 -> x_0 same or earlier block; never a padded key."""
    n = real.shape[1]
    blocks = torch.arange(n) // block
    same = blocks[None, :] == blocks[:, None]                # [query, key]
    earlier = blocks[None, :] < blocks[:, None]
    allowed = torch.cat([torch.cat([same, earlier], 1),
                         torch.cat([torch.zeros_like(same), same | earlier], 1)], 0)
    keys = torch.cat([real, real], 1)
    return allowed[None, None] & keys[:, None, None, :]


def two_stream_hidden(model: FastDLLMModel, batch: BlockBatch) -> tuple[Tensor, Tensor]:
    """Final-norm hidden states of the x_t and x_0 halves, (R, n, d) each."""
    rows, n = batch.noisy.shape
    positions = torch.arange(n).repeat(2).expand(rows, 2 * n)
    cos, sin = rope_tables(positions, model.rotary_dim(), model.config.rope_theta)
    mask = training_mask(batch.real, model.block_size)
    embed, layers = model.parts()
    h = embed(torch.cat([batch.noisy, batch.clean], 1))
    for index, layer in enumerate(layers):
        h = layer(h, cos, sin, mask, None, index, (0, 2 * n))
    h = model.model.norm(h)
    return h[:, :n], h[:, n:]


def bd_loss(model: FastDLLMModel, batch: BlockBatch, boundary: str = "clean") -> Tensor:
    """Mean cross-entropy of the shifted predictions on the masked targets."""
    noisy_h, clean_h = two_stream_hidden(model, batch)
    predictor = noisy_h[:, :-1]                              # row i scores the token at i + 1
    if boundary == "clean":
        block_start = (torch.arange(1, batch.noisy.shape[1]) % model.block_size == 0)[None, :, None]
        predictor = torch.where(block_start, clean_h[:, :-1], predictor)
    targets = batch.masked[:, 1:]
    return F.cross_entropy(model.head(predictor[targets]), batch.clean[:, 1:][targets])


@dataclass
class DecodeStats:
    """Forwards each row was live for, and the answer tokens (through EOS) it produced."""

    forwards: int = 0
    tokens: int = 0
    samples: int = 0


@torch.inference_mode()
def block_generate(model, prompts: list[list[int]], gen_length: int = 32,
                   threshold: float | None = None, stats: DecodeStats | None = None) -> list[list[int]]:
    """Greedy block-diffusion decoding of `prompt =` (uncached; the recipe's own quick check).

    Each row decodes the block (in its own position grid) holding its first mask: a step
    commits the most confident masked position of that block, every one above `threshold`,
    and, for a shifted model, the block's first position, whose logit is final once the
    previous block is (Fast-dLLM v2 commits it AR-style). A row stops when its answer holds an
    EOS and that block is complete. Returns the canvases (B lists of `gen_length` ids).
    """
    prompt_ids, prompt_mask = left_pad([p + [SEP_ID] for p in prompts])
    batch, width = prompt_ids.shape
    x = torch.cat([prompt_ids, torch.full((batch, gen_length), MASK_ID)], 1)
    attn = torch.cat([prompt_mask, torch.ones(batch, gen_length, dtype=torch.long)], 1)
    positions = default_positions(attn, *x.shape, x.device)
    blocks = positions // model.block_size
    answer = torch.arange(x.shape[1]) >= width
    done = torch.zeros(batch, dtype=torch.bool)
    while True:
        masked = (x == MASK_ID) & answer
        done |= ~masked.any(1)
        if done.all():
            break
        logits = model(x, attention_mask=attn)
        logits[..., MASK_ID] = torch.finfo(logits.dtype).min          # never commit a [MASK]
        conf, cand = logits.softmax(-1).max(-1)
        active = blocks == blocks.gather(1, masked.float().argmax(1, keepdim=True))
        eligible = masked & active & ~done[:, None]
        conf = torch.where(eligible, conf, -torch.inf)
        commit = torch.zeros_like(eligible).scatter_(1, conf.argmax(1, keepdim=True), True) & eligible
        if model.token_shift:
            commit |= eligible & (positions % model.block_size == 0)
        if threshold is not None:
            commit |= conf > threshold
        x = torch.where(commit, cand, x)
        if stats is not None:
            stats.forwards += int((~done).sum())
        block_open = ((x == MASK_ID) & answer & active).any(1)
        done |= ((x == EOS_ID) & answer).any(1) & ~block_open
    out = x[:, width:].tolist()
    if stats is not None:
        stats.samples += batch
        stats.tokens += sum(row.index(EOS_ID) + 1 if EOS_ID in row else len(row) for row in out)
    return out


def evaluate(model: FastDLLMModel, n_per_task: int) -> dict[str, dict[str, float]]:
    """Accuracy and forwards per answer token at one token per step (`k1`) and thresholds.

    Under block-causal attention the masks after the active block are invisible, so the
    canvas length changes only the cost, never the answer: one length is enough.
    """
    model.eval()
    result = {}
    for name, threshold in {"k1": None, "t0.9": 0.9, "t0.7": 0.7}.items():
        stats = DecodeStats()
        result[name] = accuracy_by_task(
            lambda prompts: block_generate(model, prompts, threshold=threshold, stats=stats), n_per_task)
        result[name]["forwards_per_sample"] = stats.forwards / stats.samples
        result[name]["tokens_per_forward"] = stats.tokens / stats.forwards
    return result


def export(model: FastDLLMModel, directory: Path) -> None:
    """bfloat16 weights, config.json `fast_dllm_llama`, tokenizer with the AR prompt template."""
    model.save_pretrained(directory, dtype=torch.bfloat16)
    save_tokenizer(directory, chat_template=AR_CHAT_TEMPLATE)


def main(argv: list[str] | None = None) -> None:
    from dllm_decode.models.causal import resolve_causal_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, steps=4000, batch_size=16)
    parser.set_defaults(lr=3e-4)
    parser.add_argument("--init", default="ar_target", help="AR model to convert (Llama layout)")
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--boundary", choices=BOUNDARY_RULES, default="clean",
                        help="score a block's first token from the clean (x_0) or noisy (x_t) copy")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--export-only", action="store_true",
                        help="export <out>/checkpoint.pt to <out>/model (e.g. mid-run) and exit")
    args = parser.parse_args(argv)
    if args.block_size < 1:
        parser.error(f"--block-size must be >= 1, got {args.block_size}")

    torch.set_num_threads(args.threads)
    model = converted(resolve_causal_dir(args.init), args.block_size)
    if args.export_only:
        export_checkpoint(model, args.out, export)
        return
    pool = build_pool(args.pool_per_task, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.2f}M parameters from {args.init}, block {args.block_size}, "
          f"pool of {len(pool)} train examples", flush=True)
    cfg = LoopConfig(steps=args.steps, lr=args.lr, warmup=min(100, args.steps // 10 + 1))
    began = time.monotonic()
    losses = train(model, lambda step: bd_loss(model, block_batch(pool, args.batch_size, args.block_size,
                                                                  step, args.seed), args.boundary),
                   cfg, args.out, resume=args.resume, max_minutes=args.max_minutes)
    export(model, args.out / "model")
    summary = {"parameters": n_params, "init": args.init, "block_size": args.block_size,
               "boundary": args.boundary, "steps": args.steps, "steps_done": len(losses),
               "batch_size": args.batch_size, "lr": args.lr,
               **run_summary(losses, began)}
    if args.eval_n:
        summary["accuracy"] = evaluate(model, args.eval_n)
    write_summary(args.out, summary)


if __name__ == "__main__":
    main()
