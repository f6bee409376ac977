"""dParallel: certainty-forcing self-distillation of a masked diffusion LM (Chen et al., 2025,
arXiv 2509.26488; `czg1225/dParallel@2ca4d14: LLaDA/llada_train.py`, `configs/config_lora_llada.yaml`).

    python -m recipes.dparallel --out /work/runs/dparallel [--init embedded] \
        [--pool-per-task N] [--steps N] [--max-minutes M] [--resume] [--eval-n N]

1. Teacher data: the model's OWN answers to train-split prompts, decoded semi-autoregressively
   one token per step (`low_confidence`, gen 256, block 32, the reference's setting) with
   `dllm_decode.generate`; only correct answers are kept (scored by the task's metric), as the
   reference's 92k set keeps only correct responses. Cached in `<out>/teacher.json`.
2. Certainty-forcing loss (spec learned-parallelism §1.2): per row, one block of the canvas is
   masked at ratio 0.5 and, in a second view, exactly its complement; both views mask every
   column after the block and leave everything before it clean. L = CE_1 + CE_2 + 2 (H_1 + H_2),
   CE_v the mean cross-entropy over the block's masked positions of view v (no 1/t weight), H_v
   the mean entropy of softmax(logits / 0.5) over those of them the model already predicts
   correctly: certainty is pushed up only where the prediction is right.
3. Full fine-tune (the paper trains a LoRA of r = 128 on LLaDA-8B; at 1.8M parameters the whole
   model is smaller than that adapter would be), AdamW, constant lr after a short warmup, weight
   decay 0.01, grad-norm clip 1 (`loop.py`: progress line, atomic checkpoints, `--resume`,
   `--max-minutes`). The weights land in `<out>/model` with `training_summary.json`.
4. Side by side in one run (`side_by_side.py`): the base and the distilled model, each at one
   token per step, confidence threshold 0.9 and `entropy_threshold` (dParallel's own rule), gen
   256: accuracy, NFE and wall-clock per prompt.

Deviations from the reference: the block is drawn among the blocks that overlap the answer or
its first EOS (the reference draws over the whole EOS-padded length; under `stop_at_eos` a block
of pure padding is never decoded, and with answers of a few tokens on a 256 canvas it would be
7 draws in 8); the masking is per row (the reference's `forward_process_semi_ar` writes every
row's block mask and rebuilds the noisy batch inside its row loop, so at batch > 1 only the last
row keeps its suffix masked, spec §1.5); the prompt is the task prompt as the model was trained
on it (no chat template exists here), left-padded with its real length known.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from recipes.data import EOS_ID, MASK_ID, PAD_ID, Pool, encode, step_rng
from recipes.loop import LoopConfig, add_run_arguments, train
from dllm_decode.outputs import atomic_write
from dllm_decode.eval.training.side_by_side import format_table, side_by_side, suite_examples

TEACHER = "teacher.json"


@dataclass(frozen=True)
class CertaintyConfig:
    """The loss constants of `llada_train.py` (spec §1.3).

    Attributes:
        block_length: the semi-AR block the masked views live in (reference 32).
        mask_ratio: t, the share of the block masked in view 1 (reference 0.5, fixed).
        eps: LLaDA's floor: each block position is masked with probability t (1 - eps) + eps.
        entropy_weight: weight of the entropy term (reference 2).
        temperature: the entropy is taken of softmax(logits / temperature) (reference 0.5).
    """

    block_length: int = 32
    mask_ratio: float = 0.5
    eps: float = 1e-3
    entropy_weight: float = 2.0
    temperature: float = 0.5

    def __post_init__(self) -> None:
        if self.block_length < 1:
            raise ValueError(f"block_length must be >= 1, got {self.block_length}")
        if not 0.0 < self.mask_ratio < 1.0:
            raise ValueError(f"mask_ratio must be in (0, 1), got {self.mask_ratio}")
        if not 0.0 <= self.eps < 1.0:
            raise ValueError(f"eps must be in [0, 1), got {self.eps}")
        if self.entropy_weight < 0 or self.temperature <= 0:
            raise ValueError(f"need entropy_weight >= 0 and temperature > 0, got "
                             f"{self.entropy_weight} and {self.temperature}")


@dataclass(frozen=True)
class Views:
    """The two complementary maskings of a `[left pad][prompt][canvas]` batch, (B, L) bool each.

    Attributes:
        first: masked in view 1: the block's drawn positions and every column after the block.
        second: masked in view 2: the block's other positions and every column after the block.
        block: the row's block (where the loss counts).
    """

    first: Tensor
    second: Tensor
    block: Tensor


def complementary_views(prompt_width: int, canvas: int, answer_lengths: list[int], cfg: CertaintyConfig,
                        rng: random.Random, gen: torch.Generator) -> Views:
    """Draw one block per row and mask it at `cfg.mask_ratio` and by its complement.

    Args:
        prompt_width: P, columns before the canvas (left padding + prompt).
        canvas: G, canvas columns (answer, then EOS to the end).
        answer_lengths: per row, the answer's length (its first EOS sits at canvas column n).
        cfg: block length and ratio.
        rng, gen: the step's generators (block choice; Bernoulli draws).
    Returns:
        `Views`; each row's block is chosen among those overlapping its answer or first EOS.
    """
    batch, width = len(answer_lengths), prompt_width + canvas
    col = torch.arange(width) - prompt_width                       # canvas column, < 0 in the prompt
    start = torch.tensor([[cfg.block_length * rng.randrange(min(n, canvas - 1) // cfg.block_length + 1)]
                          for n in answer_lengths])
    end = (start + cfg.block_length).clamp(max=canvas)
    block = (col >= start) & (col < end)
    after = col >= end
    rate = cfg.mask_ratio * (1 - cfg.eps) + cfg.eps
    drawn = torch.rand(batch, width, generator=gen) < rate
    return Views(first=(drawn & block) | after, second=(~drawn & block) | after, block=block)


@dataclass(frozen=True)
class CertaintyBatch:
    """Both views of one batch stacked along the batch axis (view 1 rows, then view 2 rows).

    Attributes:
        input_ids: (2B, L) long, [MASK] where the view masks.
        targets: (2B, L) long clean tokens.
        attention_mask: (2B, L) long, 0 on left padding.
        loss_mask: (2B, L) bool, the view's masked positions inside the block.
    """

    input_ids: Tensor
    targets: Tensor
    attention_mask: Tensor
    loss_mask: Tensor


def certainty_batch(pool: Pool, batch_size: int, canvas: int, cfg: CertaintyConfig,
                    rng: random.Random, gen: torch.Generator) -> CertaintyBatch:
    """Sample `batch_size` teacher rows, lay them out on a `canvas`-long EOS-padded canvas and
    build both views."""
    idx = [rng.randrange(len(pool)) for _ in range(batch_size)]
    prompts = [pool.prompts[i] for i in idx]
    answers = [pool.answers[i][:canvas] for i in idx]
    p = max(len(x) for x in prompts)
    rows = [[PAD_ID] * (p - len(x)) + x + a + [EOS_ID] * (canvas - len(a)) for x, a in zip(prompts, answers)]
    targets = torch.tensor(rows)
    attention = (torch.arange(p + canvas) >= torch.tensor([p - len(x) for x in prompts])[:, None]).long()
    views = complementary_views(p, canvas, [len(a) for a in answers], cfg, rng, gen)
    masked = torch.cat([views.first, views.second])
    both = targets.repeat(2, 1)
    return CertaintyBatch(input_ids=torch.where(masked, MASK_ID, both), targets=both,
                          attention_mask=attention.repeat(2, 1),
                          loss_mask=masked & views.block.repeat(2, 1))


def certainty_loss(logits: Tensor, batch: CertaintyBatch, cfg: CertaintyConfig) -> tuple[Tensor, dict[str, float]]:
    """L = sum over the two views of CE_v + entropy_weight * H_v (module docstring).

    Returns:
        The loss and its parts (`ce`, `entropy`: the two views' sums; `correct`: share of the
        loss positions already predicted right) for logging.
    """
    half = logits.shape[0] // 2
    loss = logits.new_zeros(())
    ce_sum = entropy_sum = 0.0
    right_count = total = 0
    for view in (slice(0, half), slice(half, None)):
        where = batch.loss_mask[view]
        if not where.any():
            continue
        picked, target = logits[view][where], batch.targets[view][where]
        ce = F.cross_entropy(picked, target)
        right = picked.detach().argmax(-1) == target
        entropy = picked.new_zeros(())
        if right.any():
            log_p = F.log_softmax(picked[right] / cfg.temperature, dim=-1)
            entropy = -(log_p.exp() * log_p).sum(-1).mean()
        loss = loss + ce + cfg.entropy_weight * entropy
        ce_sum, entropy_sum = ce_sum + ce.item(), entropy_sum + entropy.item()
        right_count, total = right_count + int(right.sum()), total + int(where.sum())
    return loss, {"ce": ce_sum, "entropy": entropy_sum, "correct": right_count / max(total, 1)}


def teacher_pool(model, examples: list, *, gen_length: int, block_length: int, batch_size: int = 32,
                 progress=None) -> tuple[Pool, dict[str, float]]:
    """The model's own one-token-per-step answers to `examples`, the correct ones only.

    Returns:
        The pool (prompt ids, answer ids up to the first EOS) and per-task shares kept (%).
    """
    from dllm_decode.config import DecodeConfig
    from dllm_decode.eval.tasks import TASKS
    from recipes.evaluate import decode_text
    from dllm_decode.sampler import generate
    from dllm_decode.schedulers import LowConfidenceScheduler

    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=gen_length, block_length=block_length)
    prompts, answers, kept, seen = [], [], {}, {}
    for first in range(0, len(examples), batch_size):
        chunk = examples[first:first + batch_size]
        ids = [encode(e.prompt) for e in chunk]
        result = generate(model, ids, config)
        for example, prompt, row in zip(chunk, ids, result.tokens.tolist()):
            answer = row[:row.index(EOS_ID)] if EOS_ID in row else row
            ok = TASKS[example.task].score(example, decode_text(answer))
            seen[example.task] = seen.get(example.task, 0) + 1
            kept[example.task] = kept.get(example.task, 0) + bool(ok)
            if ok:
                prompts.append(prompt)
                answers.append(answer)
        if progress:
            progress(f"teacher decodes: {first + len(chunk)}/{len(examples)}, kept {len(prompts)}")
    return Pool(prompts, answers), {task: 100.0 * kept[task] / seen[task] for task in seen}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, steps=3000, batch_size=16)
    parser.set_defaults(lr=1e-4, pool_per_task=500, eval_n=4)
    parser.add_argument("--init", default="embedded", help="the model to distil into itself (name or directory)")
    parser.add_argument("--gen-length", type=int, default=256, help="training canvas (and the comparison's)")
    parser.add_argument("--teacher-gen-length", type=int, default=None,
                        help="canvas of the teacher decodes (default --gen-length, the reference's setting; "
                             "a native canvas such as 32 costs ~8x less per forward)")
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--mask-ratio", type=float, default=0.5)
    parser.add_argument("--entropy-weight", type=float, default=2.0)
    parser.add_argument("--entropy-temperature", type=float, default=0.5)
    parser.add_argument("--entropy-threshold", type=float, default=0.5, help="tau of the entropy_threshold row")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compare-only", action="store_true",
                        help="measure <out>/model against --init side by side and exit")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from dllm_decode.models.loading import load_model

    log = lambda line: print(line, file=sys.stderr, flush=True)   # noqa: E731
    cfg = CertaintyConfig(block_length=args.block_length, mask_ratio=args.mask_ratio,
                          entropy_weight=args.entropy_weight, temperature=args.entropy_temperature)
    args.out.mkdir(parents=True, exist_ok=True)
    summary_path = args.out / "summary.json"
    if not args.compare_only:
        summary = distil(args, cfg, load_model(args.init), log)
    else:
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if args.eval_n:
        table = compare(args, load_model, log)
        summary["side_by_side"] = table
        print(format_table(table), flush=True)
    atomic_write(summary_path, json.dumps(summary, indent=2) + "\n", "summary")
    if (args.out / "model").is_dir():
        shutil.copyfile(summary_path, args.out / "model" / "training_summary.json")
    print(json.dumps({k: v for k, v in summary.items() if k != "side_by_side"}, indent=2), flush=True)


def distil(args: argparse.Namespace, cfg: CertaintyConfig, model, log) -> dict:
    """Teacher data (cached), training, export; returns the run's summary."""
    from recipes.dllm import export

    began = time.monotonic()
    teacher_file = args.out / TEACHER
    if teacher_file.is_file():
        saved = json.loads(teacher_file.read_text())
        pool, kept = Pool(saved["prompts"], saved["answers"]), saved["kept_percent"]
    else:
        examples = suite_examples(args.pool_per_task, args.seed, split="train")
        with torch.inference_mode():
            pool, kept = teacher_pool(model, examples, gen_length=args.teacher_gen_length or args.gen_length,
                                      block_length=args.block_length, progress=log)
        teacher_file.write_text(json.dumps({"prompts": pool.prompts, "answers": pool.answers,
                                            "kept_percent": kept}))
    teacher_minutes = (time.monotonic() - began) / 60
    if not len(pool):
        raise SystemExit("the teacher answered no train prompt correctly: nothing to distil")
    log(f"teacher pool: {len(pool)} correct answers ({teacher_minutes:.1f} min)")
    model.requires_grad_(True)
    parts: list[dict[str, float]] = []

    def loss_at(step: int) -> Tensor:
        rng, gen = step_rng(args.seed, step)
        batch = certainty_batch(pool, args.batch_size, args.gen_length, cfg, rng, gen)
        loss, part = certainty_loss(model(batch.input_ids, attention_mask=batch.attention_mask), batch, cfg)
        parts.append(part)
        return loss

    loop = LoopConfig(steps=args.steps, lr=args.lr, warmup=min(20, args.steps // 10 + 1), min_lr_ratio=1.0)
    trained = time.monotonic()
    losses = train(model, loss_at, loop, args.out, resume=args.resume, max_minutes=args.max_minutes)
    model.requires_grad_(False)
    export(model, args.out / "model")
    first, last = parts[:50], parts[-50:]
    return {"recipe": "recipes/dparallel.py", "init": args.init, "teacher_prompts_per_task": args.pool_per_task,
            "teacher_pool": len(pool), "teacher_kept_percent": kept, "teacher_minutes": teacher_minutes,
            "gen_length": args.gen_length, "teacher_gen_length": args.teacher_gen_length or args.gen_length,
            "loss_config": dataclasses.asdict(cfg),
            "steps_done": len(losses), "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
            "train_minutes": (time.monotonic() - trained) / 60,
            "loss_first_50": sum(losses[:50]) / max(len(losses[:50]), 1),
            "loss_last_50": sum(losses[-50:]) / max(len(losses[-50:]), 1),
            "this_session": {key: [sum(p[key] for p in chunk) / max(len(chunk), 1) for chunk in (first, last)]
                             for key in ("ce", "entropy", "correct")}}


def compare(args: argparse.Namespace, load_model, log) -> dict:
    """Base vs distilled, each at one token per step, threshold 0.9 and entropy_threshold."""
    from dllm_decode.config import DecodeConfig
    from dllm_decode.schedulers import EntropyThresholdScheduler, LowConfidenceScheduler, ThresholdScheduler

    base = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=args.gen_length,
                        block_length=args.block_length)
    configs = {"one token per step": base,
               "threshold 0.9": dataclasses.replace(base, scheduler=ThresholdScheduler(0.9)),
               f"entropy_threshold {args.entropy_threshold}":
                   dataclasses.replace(base, scheduler=EntropyThresholdScheduler(args.entropy_threshold))}
    models = {"base": load_model(args.init), "dparallel": load_model(args.out / "model")}
    return side_by_side(models, configs, suite_examples(args.eval_n, args.seed), progress=log)


if __name__ == "__main__":
    main()
