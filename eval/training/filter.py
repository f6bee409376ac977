"""Train the Learn2PD filter (`filters.LearnedFilter`) for a model: `dllm-decode train-filter`.

Recipe (Learn2PD, arXiv 2509.25188 §3; `ims-kdks/Learning-to-Parallel-Decoding@342293c:
llada/generate_training_data.py`, `train.ipynb@22837cc`):
1. Reference: the model's own one-token-per-step output (`low_confidence`), not the dataset
   answer, so the filter learns when the model's current prediction is already its final one.
2. Features and labels from the same decode's trace: at every step, the active block's
   confidence vector (`dllm_decode.filters.features.block_confidence`, exactly what the filter sees at
   decode time) and, per masked slot, whether the step's prediction equals the final token.
   The paper logs along the oracle trajectory (commit exactly the slots that already match,
   `schedulers.OracleScheduler`); `trajectory="baseline"` (default) logs the reference decode
   itself, whose steps see more still-masked context, and `"both"` logs the two.
3. BCE on the masked slots only (committed and padding slots have no decision to learn), AdamW
   at lr 3e-3, full batch, as the notebook does (fewer epochs: the data set is small).
4. Precision, recall and false-positive rate of "accept" at the filter's threshold on a
   held-out split of the prompts (split by prompt, so no decode is in both halves).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig
from dllm_decode.sampler import generate
from dllm_decode.filters.features import block_confidence, block_slots
from dllm_decode.filters.learned import LearnedFilter
from dllm_decode.filters.mlp import ConfidenceMLP, save_mlp
from dllm_decode.schedulers import LowConfidenceScheduler, OracleScheduler

Progress = Callable[[str], None]


@dataclass(frozen=True)
class StepData:
    """One row per (decode step, batch row) of the reference decodes.

    Attributes:
        features: (N, width) float32 block confidences.
        labels: (N, width) bool, the step's prediction equals the final token.
        valid: (N, width) bool, the slot was masked (the only slots the filter decides).
        prompt: (N,) long index of the prompt the row came from.
    """

    features: Tensor
    labels: Tensor
    valid: Tensor
    prompt: Tensor

    def take(self, keep: Tensor) -> "StepData":
        return StepData(self.features[keep], self.labels[keep], self.valid[keep], self.prompt[keep])

    @staticmethod
    def concat(parts: Sequence["StepData"], width: int) -> "StepData":
        if not parts:
            return StepData(torch.zeros(0, width), torch.zeros(0, width, dtype=torch.bool),
                            torch.zeros(0, width, dtype=torch.bool), torch.zeros(0, dtype=torch.long))
        return StepData(*(torch.cat([getattr(p, name) for p in parts])
                          for name in ("features", "labels", "valid", "prompt")))


def steps_from_trace(trace: list[dict[str, Any]], final: Tensor, block_length: int, width: int,
                     first_prompt: int = 0) -> StepData:
    """Features and labels of every traced step.

    Args:
        trace: `DecodeResult.trace` of a fixed-block decode (offsets relative to the generation
            start; the step's block starts at the offset rounded down to the block grid).
        final: (B, G) the decode's final tokens (the reference).
        block_length: the decode's block length.
        width: the filter's input width.
        first_prompt: prompt index of batch row 0.
    """
    gen = final.shape[1]
    parts: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
    for record in trace:
        rows, offset, confidence = record["rows"], record["offset"], record["confidence"]
        start = offset - offset % block_length
        block = torch.tensor([[start, min(start + block_length, gen)]]).expand(rows.shape[0], 2)
        features = block_confidence(confidence, offset, block, width)
        column, real = block_slots(offset, block, confidence.shape[1], width)
        predicted = record["tokens"].gather(1, column)
        reference = final[rows].gather(1, (column + offset).clamp(max=gen - 1))
        valid = real & torch.isfinite(confidence.gather(1, column))
        parts.append((features, predicted == reference, valid, rows + first_prompt))
    return StepData.concat([StepData(*part) for part in parts], width)


TRAJECTORIES = ("baseline", "oracle", "both")


def collect(model: Any, prompts: Sequence[str] | Sequence[Sequence[int]], *, gen_length: int,
            block_length: int, width: int, trajectory: str = "baseline", batch_size: int = 32,
            progress: Progress | None = None) -> tuple[StepData, Tensor, Tensor]:
    """Reference decodes of `prompts` (one token per step) and the traced step data.

    Args:
        trajectory: whose steps to log: the reference decode itself (`baseline`), the oracle
            that commits exactly the slots already equal to the reference (`oracle`, the
            paper's choice), or `both`.
    Returns:
        The step data, the (N, G) reference tokens and the reference NFE per prompt.
    """
    if trajectory not in TRAJECTORIES:
        raise ValueError(f"trajectory must be one of {list(TRAJECTORIES)}, got {trajectory!r}")
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=gen_length,
                          block_length=block_length)
    data, references, nfe = [], [], []
    for first in range(0, len(prompts), batch_size):
        chunk = list(prompts[first:first + batch_size])
        result = generate(model, chunk, config, trace=trajectory != "oracle")
        if trajectory != "oracle":
            data.append(steps_from_trace(result.trace or [], result.tokens, block_length, width, first))
        if trajectory != "baseline":
            oracle = dataclasses.replace(config, scheduler=OracleScheduler.from_reference(result.tokens))
            traced = generate(model, chunk, oracle, trace=True)
            data.append(steps_from_trace(traced.trace or [], result.tokens, block_length, width, first))
        references.append(result.tokens)
        nfe.append(result.nfe)
        if progress:
            progress(f"reference decodes: {first + len(chunk)}/{len(prompts)}")
    return StepData.concat(data, width), torch.cat(references), torch.cat(nfe)


def decode_report(model: Any, prompts: Sequence[str] | Sequence[Sequence[int]], reference: Tensor,
                  learned: LearnedFilter, *, gen_length: int, block_length: int,
                  batch_size: int = 32) -> dict[str, float]:
    """Mean NFE of the oracle and of `learned` over one-token-per-step decoding on `prompts`,
    and the share of `learned` outputs identical to the reference."""
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=gen_length,
                          block_length=block_length)
    oracle_nfe, learned_nfe, same = [], [], []
    for first in range(0, len(prompts), batch_size):
        chunk, ref = list(prompts[first:first + batch_size]), reference[first:first + batch_size]
        oracle = dataclasses.replace(config, scheduler=OracleScheduler.from_reference(ref))
        oracle_nfe.append(generate(model, chunk, oracle).nfe)
        result = generate(model, chunk, dataclasses.replace(config, filters=[learned]))
        learned_nfe.append(result.nfe)
        same.append((result.tokens == ref).all(-1))
    return {"oracle_nfe_mean": float(torch.cat(oracle_nfe).double().mean()),
            "learned_nfe_mean": float(torch.cat(learned_nfe).double().mean()),
            "learned_same_as_reference": float(torch.cat(same).double().mean())}


def fit(data: StepData, *, width: int, hidden: int = 32, epochs: int = 2000, lr: float = 3e-3,
        seed: int = 0, progress: Progress | None = None) -> ConfidenceMLP:
    """Full-batch AdamW on BCE over the valid slots; returns the trained (eval-mode) network."""
    torch.manual_seed(seed)          # a training recipe, not library code: seeds its own init
    module = ConfidenceMLP(width, hidden)
    optimiser = torch.optim.AdamW(module.parameters(), lr=lr)
    weight = data.valid.float()
    targets = data.labels.float()
    loss_fn = torch.nn.BCEWithLogitsLoss(reduction="none")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)         # a 2k-parameter network: thread fan-out costs more than it saves
    try:
        _epochs(module, optimiser, loss_fn, data.features, targets, weight, epochs, progress)
    finally:
        torch.set_num_threads(threads)
    module.requires_grad_(False)
    return module.eval()


def _epochs(module, optimiser, loss_fn, features: Tensor, targets: Tensor, weight: Tensor,
            epochs: int, progress: Progress | None) -> None:
    with torch.enable_grad():
        for epoch in range(1, epochs + 1):
            optimiser.zero_grad()
            loss = (loss_fn(module(features), targets) * weight).sum() / weight.sum().clamp_min(1)
            loss.backward()
            optimiser.step()
            if progress and (epoch % max(epochs // 10, 1) == 0 or epoch == epochs):
                progress(f"epoch {epoch}/{epochs}: loss {loss.item():.4f}")


def metrics(module: ConfidenceMLP, data: StepData, threshold: float) -> dict[str, float]:
    """Accept quality at `threshold` over the valid slots: precision, recall, false-positive
    rate, accuracy, and the base rate of positive labels."""
    with torch.no_grad():
        accept = torch.sigmoid(module(data.features)) > threshold
    accept, label = accept[data.valid], data.labels[data.valid]
    tp, fp = (accept & label).sum().item(), (accept & ~label).sum().item()
    fn, tn = (~accept & label).sum().item(), (~accept & ~label).sum().item()
    total = max(tp + fp + fn + tn, 1)
    return {"slots": tp + fp + fn + tn, "base_rate": (tp + fn) / total,
            "accuracy": (tp + tn) / total, "precision": tp / max(tp + fp, 1),
            "recall": tp / max(tp + fn, 1), "false_positive_rate": fp / max(fp + tn, 1),
            "accepted_share": (tp + fp) / total}


def split_prompts(n: int, heldout: float, seed: int) -> tuple[list[int], list[int]]:
    """Shuffle prompt indices with `seed`; the last `heldout` share is held out (at least one)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    cut = n - max(1, round(n * heldout)) if n > 1 else n
    return sorted(order[:cut]), sorted(order[cut:])


def train_filter(model: Any, prompts: Sequence[str] | Sequence[Sequence[int]], *, gen_length: int = 256,
                 block_length: int = 32, width: int = 32, hidden: int = 32, epochs: int = 2000,
                 lr: float = 3e-3, threshold: float = 0.96, heldout: float = 0.1,
                 trajectory: str = "baseline", seed: int = 0, batch_size: int = 32,
                 out: str | None = None, progress: Progress | None = None
                 ) -> tuple[ConfidenceMLP, dict[str, Any]]:
    """Reference decodes -> step data -> trained filter (+ held-out report), optionally saved.

    Returns:
        The network and a JSON-ready report: data sizes, the reference NFE, `metrics` on the
        train and held-out slots and, when saved to `out`, `decode_report` on the held-out
        prompts (oracle NFE, NFE of `learned` over one token per step, agreement).
    Raises:
        ValueError: no prompts, or the decodes produced no masked slot to learn from.
    """
    if not prompts:
        raise ValueError("train_filter needs at least one prompt")
    data, reference, nfe = collect(model, prompts, gen_length=gen_length, block_length=block_length,
                                   width=width, trajectory=trajectory, batch_size=batch_size,
                                   progress=progress)
    train_ids, test_ids = split_prompts(len(prompts), heldout, seed)
    in_train = torch.isin(data.prompt, torch.tensor(train_ids))
    train, test = data.take(in_train), data.take(~in_train)
    if not train.valid.any():
        raise ValueError("the reference decodes left no masked slot to learn from")
    module = fit(train, width=width, hidden=hidden, epochs=epochs, lr=lr, seed=seed, progress=progress)
    report: dict[str, Any] = {
        "prompts": len(prompts), "train_prompts": len(train_ids), "heldout_prompts": len(test_ids),
        "trajectory": trajectory, "steps": int(data.features.shape[0]), "gen_length": gen_length,
        "block_length": block_length, "width": width, "hidden": hidden, "epochs": epochs,
        "threshold": threshold, "reference_nfe_mean": float(nfe.double().mean()),
        "train": metrics(module, train, threshold), "heldout": metrics(module, test, threshold)}
    if out is not None:
        save_mlp(module, out, metadata={"gen_length": str(gen_length), "block_length": str(block_length),
                                        "prompts": str(len(prompts)), "trajectory": trajectory,
                                        "recipe": "eval/training/filter.py"})
        learned = LearnedFilter(weights=str(out), width=width, threshold=threshold)
        held = [prompts[i] for i in test_ids]
        report["heldout_decode"] = decode_report(model, held, reference[test_ids], learned,
                                                 gen_length=gen_length, block_length=block_length,
                                                 batch_size=batch_size)
    return module, report


def task_prompts(per_task: int, seed: int = 0, split: str = "train") -> list[str]:
    """`per_task` prompts of every registered task's `split`, in registry order."""
    from dllm_decode.eval.tasks import TASKS

    return [example.prompt for task in TASKS.values() for example in task.examples(split, per_task, seed)]


def compare(model: Any, per_task: int = 10, *, gen_length: int = 256, block_length: int = 32,
            weights: str = "embedded", seed: int = 0, progress: Progress | None = None
            ) -> dict[str, dict[str, float]]:
    """Accuracy and speed of the Learn2PD configurations on the test split, one prompt at a time.

    Rows: `low_confidence` (one token per step, also the oracle's reference), `threshold` 0.9,
    `learned`, `learned + eotp`, `learned + eotp + dual cache`, `learned + eotp (predicted)`, and
    the oracle (reference: the `low_confidence` output).
    """
    from dllm_decode.caches import DualCache
    from dllm_decode.eval.tasks import TASKS
    from dllm_decode.filters.eotp import EoTPFilter
    from dllm_decode.schedulers import ThresholdScheduler

    examples = [e for task in TASKS.values() for e in task.examples("test", per_task, seed)]
    base = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=gen_length, block_length=block_length)
    learned = LearnedFilter(weights=weights)
    runs: dict[str, tuple[DecodeConfig, Any, list]] = {
        "low_confidence": (base, None, []),
        "threshold_0.9": (dataclasses.replace(base, scheduler=ThresholdScheduler(threshold=0.9)), None, []),
        "learned": (base, None, [learned]),
        "learned+eotp": (base, None, [learned, EoTPFilter()]),
        "learned+eotp+dual": (base, DualCache(), [learned, EoTPFilter()]),
        "learned+eotp_predicted": (base, None, [learned, EoTPFilter(mode="predicted")]),
    }
    rows: dict[str, list[tuple[float, int, float, float]]] = {name: [] for name in [*runs, "oracle"]}
    for i, example in enumerate(examples):
        score = TASKS[example.task].score
        reference = None
        for name, (config, cache, filters) in runs.items():
            result = generate(model, [example.prompt], dataclasses.replace(config, cache=cache, filters=filters))
            rows[name].append((score(example, result.text[0]), int(result.nfe[0]),
                               float(result.tokens_per_step[0]), result.seconds))
            reference = result.tokens if reference is None else reference
        oracle = dataclasses.replace(base, scheduler=OracleScheduler.from_reference(reference))
        result = generate(model, [example.prompt], oracle)
        rows["oracle"].append((score(example, result.text[0]), int(result.nfe[0]),
                               float(result.tokens_per_step[0]), result.seconds))
        if progress and ((i + 1) % 5 == 0 or i + 1 == len(examples)):
            progress(f"compared {i + 1}/{len(examples)}")
    return {name: {"accuracy": 100 * sum(r[0] for r in rs) / len(rs),
                   "nfe": sum(r[1] for r in rs) / len(rs),
                   "tokens_per_step": sum(r[2] for r in rs) / len(rs),
                   "seconds": sum(r[3] for r in rs) / len(rs)} for name, rs in rows.items()}


if __name__ == "__main__":
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(description="Learn2PD comparison table on the test split (batch 1).")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--weights", default="embedded")
    parser.add_argument("--per-task", type=int, default=10)
    parser.add_argument("--gen-length", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (batch-1 decoding of a small model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from dllm_decode.models.loading import load_model

    table = compare(load_model(args.model), args.per_task, gen_length=args.gen_length,
                    weights=args.weights, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(table, indent=1))
