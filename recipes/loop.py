"""The optimisation loop both recipes share: AdamW, warmup + cosine schedule, gradient clipping,
a progress line (step, loss, it/s, ETA), and atomic checkpoints every few minutes for `--resume`."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

CHECKPOINT = "checkpoint.pt"


def add_run_arguments(parser: argparse.ArgumentParser, steps: int, batch_size: int) -> None:
    """The command-line options both recipes share."""
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="stop (checkpointed, resumable) and export after this much wall-clock")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--pool-per-task", type=int, default=12000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-n", type=int, default=20, help="test examples per task (0: skip)")


@dataclass(frozen=True)
class LoopConfig:
    """Optimisation hyper-parameters.

    Attributes:
        steps: total optimizer steps (the schedule is laid out over them).
        lr: peak learning rate; warmup: linear warmup steps; min_lr_ratio: cosine floor.
        checkpoint_minutes: wall-clock minutes between checkpoints.
        log_every: steps between progress lines.
    """

    steps: int
    lr: float = 1e-3
    warmup: int = 200
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.01
    clip: float = 1.0
    checkpoint_minutes: float = 4.0
    log_every: int = 25

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")

    def lr_at(self, step: int, time_share: float = 0.0) -> float:
        """Warmup, then cosine over max(step progress, `time_share` of the wall-clock budget)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = max((step - self.warmup) / max(1, self.steps - self.warmup), time_share)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine)


def train(model: nn.Module, loss_at: Callable[[int], Tensor], cfg: LoopConfig, out: Path,
          resume: bool = False, max_minutes: float | None = None, log=sys.stdout) -> list[float]:
    """Run steps `[start, cfg.steps)`; `loss_at(step)` builds that step's batch and returns its loss.

    `max_minutes` bounds the wall-clock (summed over resumed sessions): the machine is shared
    and step rates vary, so the cosine then follows whichever of step or time progress is
    further along, and the run stops (checkpointed) when the budget is spent. Without it the
    run is a pure function of the seed, resumed or not.
    Returns the per-step losses of the whole run (restored from the checkpoint on resume).
    """
    out.mkdir(parents=True, exist_ok=True)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98),
                              weight_decay=cfg.weight_decay)
    start, losses, spent = 0, [], 0.0
    if resume and (out / CHECKPOINT).is_file():
        state = load_checkpoint(out / CHECKPOINT)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start, losses, spent = state["step"], state["losses"], state.get("seconds", 0.0)
        print(f"resumed at step {start}", file=log, flush=True)
    model.train()
    began = last_save = time.monotonic()
    budget = None if max_minutes is None else 60 * max_minutes
    for step in range(start, cfg.steps):
        elapsed = spent + time.monotonic() - began
        time_share = 0.0 if budget is None else elapsed / budget
        for group in optim.param_groups:
            group["lr"] = cfg.lr_at(step, time_share)
        loss = loss_at(step)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        optim.step()
        losses.append(loss.item())
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            rate = (done - start) / (time.monotonic() - began)
            recent = losses[-cfg.log_every:]
            print(f"step {done}/{cfg.steps} loss {sum(recent) / len(recent):.4f} "
                  f"lr {optim.param_groups[0]['lr']:.2e} {rate:.2f} it/s "
                  f"ETA {(cfg.steps - done) / rate / 60:.1f} min", file=log, flush=True)
        out_of_time = budget is not None and spent + time.monotonic() - began > budget
        if time.monotonic() - last_save > 60 * cfg.checkpoint_minutes or done == cfg.steps or out_of_time:
            save_checkpoint(out, model, optim, done, losses, spent + time.monotonic() - began)
            last_save = time.monotonic()
        if out_of_time:
            print(f"stopped at step {done}: --max-minutes {max_minutes} reached", file=log, flush=True)
            break
    model.eval()
    return losses


def save_checkpoint(out: Path, model: nn.Module, optim: torch.optim.Optimizer, step: int,
                    losses: list[float], seconds: float) -> None:
    """Write atomically, so a kill during the write never leaves a torn checkpoint. Only tensors,
    numbers, strings, lists and dicts: `load_checkpoint` reads it without unpickling code."""
    from dllm_decode.outputs import write_with

    state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step,
             "losses": losses, "seconds": seconds}
    write_with(out / CHECKPOINT, lambda tmp: torch.save(state, tmp), "checkpoint")


def load_checkpoint(path: Path) -> dict:
    """A checkpoint written by `save_checkpoint`, read with `torch.load(weights_only=True)`: a
    file holding anything but tensors and plain data (a crafted pickle) is refused, never run.

    Raises:
        SystemExit: one line naming the file, for a file that is not such a checkpoint.
    """
    import pickle

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:
        raise SystemExit(f"error: {path} holds Python objects besides tensors and plain data; it is "
                         f"refused (loading it could run code), so it was not written by this recipe") from None
    except Exception as err:  # noqa: BLE001 - torch raises several types for a broken file
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SystemExit(f"error: {path} is not a training checkpoint this recipe wrote: {first}") from None


def export_checkpoint(model: nn.Module, out: Path, export: Callable[[nn.Module, Path], None]) -> None:
    """`--export-only`: load `<out>/checkpoint.pt` (e.g. mid-run) into `model`, export it to
    `<out>/model` with the recipe's `export`."""
    model.load_state_dict(load_checkpoint(out / CHECKPOINT)["model"])
    export(model, out / "model")
    print(f"exported {out / CHECKPOINT} to {out / 'model'}")


def run_summary(losses: list[float], began: float) -> dict[str, float]:
    """Wall-clock minutes since `began` (`time.monotonic()`) and the mean loss of the first and
    last 100 steps: the part of `summary.json` every recipe shares."""
    return {"train_minutes": (time.monotonic() - began) / 60,
            "loss_first_100": sum(losses[:100]) / len(losses[:100]),
            "loss_last_100": sum(losses[-100:]) / len(losses[-100:])}


def write_summary(out: Path, summary: dict) -> None:
    """Write `<out>/summary.json` and print it."""
    from dllm_decode.outputs import atomic_write

    atomic_write(out / "summary.json", json.dumps(summary, indent=2) + "\n", "summary")
    print(json.dumps(summary, indent=2), flush=True)
