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
import tempfile
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any

import click
import torch
from torch import Tensor

from dllm_decode.cost import CORES
from dllm_decode.config import DecodeConfig
from dllm_decode.sampler import generate
from dllm_decode.filters.learned import LearnedFilter
from dllm_decode.filters.mlp import ConfidenceMLP, save_mlp
from dllm_decode.schedulers import LowConfidenceScheduler, OracleScheduler
from dllm_decode.eval.training.onpolicy import rollouts
from dllm_decode.eval.training.side_by_side import suite_examples
from dllm_decode.eval.training.steps import StepData, label_slots

Progress = Callable[[str], None]


def steps_from_trace(trace: list[dict[str, Any]], final: Tensor, block_length: int, width: int,
                     first_prompt: int = 0) -> StepData:
    """Features and labels of every traced step.

    Args:
        trace: `DecodeResult.trace` of a fixed-block decode whose written tokens are its
            candidates (`low_confidence`; offsets relative to the generation start; the step's
            block starts at the offset rounded down to the block grid).
        final: (B, G) the decode's final tokens (the reference).
        block_length: the decode's block length.
        width: the filter's input width.
        first_prompt: prompt index of batch row 0.
    """
    gen = final.shape[1]
    parts: list[StepData] = []
    for record in trace:
        rows, offset, confidence = record["rows"], record["offset"], record["confidence"]
        start = offset - offset % block_length
        block = torch.tensor([[start, min(start + block_length, gen)]]).expand(rows.shape[0], 2)
        columns = (torch.arange(confidence.shape[1]) + offset).clamp(max=gen - 1)
        reference = final[rows][:, columns]
        # a one-token-per-step decode writes its candidates, so its trace's tokens are predictions
        parts.append(StepData(*label_slots(confidence, record["tokens"], reference, offset, block, width),
                              rows + first_prompt))
    return StepData.concat(parts, width)


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
            # the oracle writes reference tokens, so its states are logged with the model's own
            # predictions by the on-policy logger (all steps the expert's, no filter, no EoTP)
            oracle, _ = rollouts(model, chunk, result.tokens, policy=None, beta=1.0, gen_length=gen_length,
                                 block_length=block_length, width=width, eotp=False, batch_size=len(chunk))
            data.append(dataclasses.replace(oracle, prompt=oracle.prompt + first))
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
        seed: int = 0, balance: bool = False, progress: Progress | None = None) -> ConfidenceMLP:
    """Full-batch AdamW on BCE over the valid slots; returns the trained (eval-mode) network.

    `balance`: weight the valid slots so that positives and negatives each carry half the loss
    (`class_weights`). The accept probability is then no longer the share of correct
    predictions: with positives in the majority (the usual case) it is lowered, so a fixed
    accept threshold becomes stricter.
    """
    torch.manual_seed(seed)          # a training recipe, not library code: seeds its own init
    module = ConfidenceMLP(width, hidden)
    optimiser = torch.optim.AdamW(module.parameters(), lr=lr)
    weight = class_weights(data) if balance else data.valid.float()
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


def class_weights(data: StepData) -> Tensor:
    """(N, width) weights: 0 on invalid slots; on valid ones, each present class sums to half of
    the valid count (mean weight 1), so the rarer class is up-weighted."""
    valid = data.valid.float()
    positive = (data.labels & data.valid).float()
    n, n_pos = valid.sum(), positive.sum()
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0:
        return valid
    return positive * (n / (2 * n_pos)) + (valid - positive) * (n / (2 * n_neg))


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
                 trajectory: str = "baseline", rounds: int = 0, beta: float = 0.5,
                 beta_decay: float = 0.5, balance: bool = False, rollout_eotp: bool = True,
                 seed: int = 0, batch_size: int = 32,
                 out: str | None = None, save_rounds: bool = False, progress: Progress | None = None
                 ) -> tuple[ConfidenceMLP, dict[str, Any]]:
    """Reference decodes -> step data -> trained filter, then `rounds` on-policy (DAgger) rounds
    (+ held-out report), optionally saved.

    Round r (1..rounds) decodes every prompt under the current filter (`onpolicy.rollouts`: the
    filter's accepts with the one-token-per-step top-1, then EoTP unless `rollout_eotp` is off;
    with probability beta * beta_decay^(r-1) a step takes the oracle's commits), adds the logged
    states to the data, and retrains from scratch on all of it.

    Returns:
        The network and a JSON-ready report: data sizes, the reference NFE, `metrics` on the
        train and held-out slots, per round the rollout figures and `metrics` of the rolled-out
        filter and of its successor on the round's held-out on-policy states, and, when saved to
        `out`, `decode_report` on the held-out prompts (oracle NFE, NFE of `learned` over one
        token per step, agreement).
    With `out` and `save_rounds`, the filter of every round r (0 = before the first rollout) is
    also written next to `out` as `<stem>.round<r>.safetensors`.

    Raises:
        ValueError: no prompts, a bad round setting, or the decodes produced no masked slot to
            learn from.
    """
    if not prompts:
        raise ValueError("train_filter needs at least one prompt")
    if rounds < 0 or not 0.0 <= beta <= 1.0 or not 0.0 <= beta_decay <= 1.0:
        raise ValueError(f"need rounds >= 0 and beta, beta_decay in [0, 1], got {rounds}, {beta}, {beta_decay}")
    data, reference, nfe = collect(model, prompts, gen_length=gen_length, block_length=block_length,
                                   width=width, trajectory=trajectory, batch_size=batch_size,
                                   progress=progress)
    train_ids, test_ids = split_prompts(len(prompts), heldout, seed)

    def held(part: StepData) -> Tensor:
        return ~torch.isin(part.prompt, torch.tensor(train_ids))

    if not data.take(~held(data)).valid.any():
        raise ValueError("the reference decodes left no masked slot to learn from")
    train_fit = dict(width=width, hidden=hidden, epochs=epochs, lr=lr, seed=seed, balance=balance,
                     progress=progress)
    module = fit(data.take(~held(data)), **train_fit)
    meta = {"gen_length": str(gen_length), "block_length": str(block_length), "prompts": str(len(prompts)),
            "trajectory": trajectory, "beta": str(beta), "balance": str(balance),
            "rollout_eotp": str(rollout_eotp),
            "recipe": "eval/training/filter.py"}

    def keep_round(r: int) -> None:
        if out is not None and save_rounds:
            save_mlp(module, Path(out).with_suffix(f".round{r}.safetensors"), metadata={**meta, "rounds": str(r)})

    keep_round(0)
    round_reports = []
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(1, rounds + 1):
            path = Path(scratch) / f"round{r}.safetensors"
            save_mlp(module, path)
            policy = LearnedFilter(weights=str(path), width=width, threshold=threshold)
            mix = beta * beta_decay ** (r - 1)
            new, stats = rollouts(model, prompts, reference, policy=policy, beta=mix, gen_length=gen_length,
                                  block_length=block_length, width=width, eotp=rollout_eotp, seed=seed + r,
                                  batch_size=batch_size)
            before = metrics(module, new.take(held(new)), threshold)
            data = StepData.concat([data, new], width)
            module = fit(data.take(~held(data)), **train_fit)
            keep_round(r)
            round_reports.append({"round": r, "beta": mix, **stats, "heldout_onpolicy_before": before,
                                  "heldout_onpolicy_after": metrics(module, new.take(held(new)), threshold)})
            if progress:
                progress(f"round {r}/{rounds}: beta {mix:.3g}, {stats['rows']} states, rollout NFE "
                         f"{stats['nfe_mean']:.2f}, held-out precision {before['precision']:.3f} -> "
                         f"{round_reports[-1]['heldout_onpolicy_after']['precision']:.3f}")
    train, test = data.take(~held(data)), data.take(held(data))
    report: dict[str, Any] = {
        "prompts": len(prompts), "train_prompts": len(train_ids), "heldout_prompts": len(test_ids),
        "trajectory": trajectory, "rounds": rounds, "beta": beta, "beta_decay": beta_decay,
        "balance": balance, "rollout_eotp": rollout_eotp, "steps": int(data.features.shape[0]),
        "gen_length": gen_length,
        "block_length": block_length, "width": width, "hidden": hidden, "epochs": epochs,
        "threshold": threshold, "reference_nfe_mean": float(nfe.double().mean()),
        "train": metrics(module, train, threshold), "heldout": metrics(module, test, threshold),
        "round_reports": round_reports}
    if out is not None:
        save_mlp(module, out, metadata={**meta, "rounds": str(rounds)})
        learned = LearnedFilter(weights=str(out), width=width, threshold=threshold)
        held_prompts = [prompts[i] for i in test_ids]
        report["heldout_decode"] = decode_report(model, held_prompts, reference[test_ids], learned,
                                                 gen_length=gen_length, block_length=block_length,
                                                 batch_size=batch_size)
    return module, report


def task_prompts(per_task: int, seed: int = 0, split: str = "train") -> list[str]:
    """`per_task` prompts of every registered task's `split`, in registry order."""
    return [example.prompt for example in suite_examples(per_task, seed, split)]


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

    examples = suite_examples(per_task, seed)
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
            result = generate(model, [example.prompt], dataclasses.replace(
                config, cache=cache if cache is not None else config.cache, filters=tuple(filters)))
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


@click.command("filter", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "model_name", default="embedded", show_default=True, help="The diffusion model.")
@click.option("--weights", default="embedded", show_default=True,
              help="The filter's safetensors file; `embedded` is the shipped one.")
@click.option("--per-task", type=click.IntRange(1), default=10, show_default=True,
              help="Test-split prompts per task.")
@click.option("--gen-length", type=click.IntRange(1), default=256, show_default=True)
@click.option("--threads", type=click.IntRange(1, CORES), default=1, show_default=True,
              help="torch threads (batch-1 decoding of a small model).")
def main(model_name: str, weights: str, per_task: int, gen_length: int, threads: int) -> None:
    """Learn2PD comparison table on the test split (batch 1): one token per step, threshold 0.9,
    the learned filter alone, with EoTP, with the dual cache, and the oracle. Prints JSON."""
    import json

    from dllm_decode.eval.training.side_by_side import command_model

    torch.set_num_threads(threads)
    model = command_model(model_name)
    try:
        table = compare(model, per_task, gen_length=gen_length, weights=weights,
                        progress=lambda line: click.echo(line, err=True))
    except ValueError as err:                          # a weights file that does not load
        raise click.BadParameter(str(err).splitlines()[0], param_hint="--weights") from None
    click.echo(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
