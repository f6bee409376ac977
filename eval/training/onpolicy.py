"""On-policy (DAgger) rounds for the Learn2PD filter (DAgger: Ross
et al., 2011, arXiv 1011.0686; Learn2PD: Bao et al., arXiv 2509.25188).

The shipped filter was trained on states its training decodes visit (the one-token-per-step
reference, or the oracle that commits every matching slot at once), never on the states it
visits itself, where its own accepts leave blocks partly decoded and its false positives matter
most. A round decodes the training prompts under the deployed rule (the filter's accepts united
with the one-token-per-step top-1, then EoTP) and logs every visited state labelled against the
model's own one-token-per-step reference; the filter is retrained on all data so far.

Labels after an error: a block stops being logged at the policy's first wrong commit, and the
decode resumes from the oracle state (rather than relabelling against a fresh one-token-per-step
run from the diverged state, which costs extra forwards): every commit writes the reference
token, so the canvas never holds a wrong token and every logged label is exact. The state at the
wrong commit itself is logged (the mistake is what the filter must learn). With probability
`beta` a row's step takes the oracle's commit set instead (every slot that already matches, or
one reference token on a stall), DAgger's mixture with the expert.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import click
import torch

from dllm_decode.cost import CORES
from dllm_decode.config import DecodeConfig
from dllm_decode.filters.eotp import EoTPFilter
from dllm_decode.filters.learned import LearnedFilter
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import argmax_mask
from dllm_decode.sampler import generate
from dllm_decode.schedulers import OracleScheduler
from dllm_decode.eval.training.steps import StepData, label_slots


@dataclass(frozen=True)
class OnPolicyLogger(Scheduler):
    """The deployed Learn2PD rule with expert mixing, logging every visited state to `sink`.

    A training tool, not a registry scheduler: `sink` is a list it appends to (one dict of CPU
    tensors per step: `features`, `labels`, `valid` (B_logged, width); per logged row `row` its
    batch row in the request, `oracle` whether the step took the expert's commits, `first`
    whether it is the block's first step, `wrong` whether the policy committed a wrong token,
    which ends the block's logging).

    Attributes:
        reference: (B, G) the reference tokens per row (the model's one-token-per-step output).
        policy: the filter under training (None: the top-1 alone, one token per step).
        beta: probability that a row's step takes the oracle's commit set.
        width: the filter's input width.
    """

    reference: tuple[tuple[int, ...], ...] = ()
    policy: LearnedFilter | None = None
    beta: float = 0.0
    width: int = 32
    sink: list = field(default_factory=list, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {self.beta}")
        if self.policy is not None and self.policy.width != self.width:
            raise ValueError(f"policy width {self.policy.width} differs from width {self.width}")

    @property
    def oracle(self) -> OracleScheduler:
        return OracleScheduler(reference=self.reference)

    def init_state(self, batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
        return {"reference": self.oracle.init_state(batch_size, device),
                "row": torch.arange(batch_size, device=device),
                "diverged": torch.zeros(batch_size, dtype=torch.bool, device=device),
                "block_start": torch.full((batch_size,), -1, dtype=torch.long, device=device)}

    def select(self, inp: StepInput, state: dict[str, torch.Tensor]) -> tuple[Decision, Any]:
        target = OracleScheduler.window_reference(inp, state["reference"])
        new_block = inp.block[:, 0] != state["block_start"]
        diverged = state["diverged"] & ~new_block
        expert, _ = self.oracle.select(inp, state["reference"])
        policy = argmax_mask(inp.confidence)                    # one token per step underneath
        if self.policy is not None:
            policy = policy | self.policy.accept(inp)
        draws = torch.rand(inp.live.shape, generator=inp.generator, device=inp.live.device)
        use_oracle = draws < self.beta
        commit = torch.where(use_oracle.unsqueeze(-1), expert.commit, policy) & inp.eligible
        wrong = commit & (inp.candidates != target) & ~use_oracle.unsqueeze(-1)
        logged = inp.live & ~diverged
        if logged.any():
            features, labels, valid = label_slots(inp.confidence, inp.candidates, target, inp.offset,
                                                  inp.block, self.width)
            self.sink.append({"features": features[logged].cpu(), "labels": labels[logged].cpu(),
                              "valid": valid[logged].cpu(), "row": state["row"][logged].cpu(),
                              "oracle": use_oracle[logged].cpu(), "first": new_block[logged].cpu(),
                              "wrong": wrong.any(-1)[logged].cpu()})
        tokens = torch.where(target >= 0, target, inp.candidates)   # resume from the oracle state
        new_state = {**state, "diverged": diverged | wrong.any(-1), "block_start": inp.block[:, 0]}
        return Decision(commit=commit, tokens=tokens), new_state


def logged_steps(sink: list[dict[str, torch.Tensor]], width: int, first_prompt: int = 0) -> StepData:
    """The sink's records as `StepData` (prompt = batch row + `first_prompt`)."""
    return StepData.concat([StepData(r["features"], r["labels"], r["valid"], r["row"] + first_prompt)
                            for r in sink], width)


def rollouts(model: Any, prompts: Sequence[str] | Sequence[Sequence[int]], reference: torch.Tensor, *,
             policy: LearnedFilter | None, beta: float, gen_length: int, block_length: int, width: int,
             eotp: bool = True, seed: int = 0, batch_size: int = 32) -> tuple[StepData, dict[str, float]]:
    """Decode `prompts` under the mixed policy and return the logged states.

    Args:
        reference: (N, G) each prompt's reference tokens.
        policy: the filter to roll out (None: one token per step); beta: expert share of steps.
        eotp: add EoTP after the policy, as deployed.
        seed: the mixing draws' seed (each batch its own generator).
    Returns:
        The step data and figures of the round: mean NFE, logged rows, the share of logged
        rows whose step came from the oracle, and the share of visited (prompt, block) pairs
        whose logging a wrong commit cut short.
    """
    data, nfe, records = [], [], []
    for first in range(0, len(prompts), batch_size):
        chunk = list(prompts[first:first + batch_size])
        logger = OnPolicyLogger(reference=tuple(tuple(r) for r in reference[first:first + batch_size].tolist()),
                                policy=policy, beta=beta, width=width)
        config = DecodeConfig(scheduler=logger, gen_length=gen_length, block_length=block_length,
                              filters=[EoTPFilter()] if eotp else [], seed=seed + first)
        nfe.append(generate(model, chunk, config).nfe)
        data.append(logged_steps(logger.sink, width, first))
        records += logger.sink
    steps = StepData.concat(data, width)
    rows = int(steps.features.shape[0])
    count = {key: sum(int(r[key].sum()) for r in records) for key in ("oracle", "first", "wrong")}
    return steps, {"nfe_mean": float(torch.cat(nfe).double().mean()), "rows": rows,
                   "oracle_row_share": count["oracle"] / max(rows, 1),
                   "blocks_cut_by_a_wrong_commit": count["wrong"] / max(count["first"], 1)}


def compare_filters(model: Any, weights: dict[str, str], *, per_task: int = 4, gen_length: int = 256,
                    block_length: int = 32, seed: int = 0, progress=None) -> dict[str, dict[str, float]]:
    """One token per step (alone and + eotp) vs each named filter alone and + eotp, side by side
    in one run (`side_by_side.side_by_side`, test split, batch 1)."""
    from dllm_decode.eval.training.side_by_side import side_by_side, suite_examples
    from dllm_decode.schedulers import LowConfidenceScheduler

    base = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=gen_length, block_length=block_length)
    configs = {"one token per step": base,
               "one token per step + eotp": dataclasses.replace(base, filters=[EoTPFilter()])}
    for name, path in weights.items():
        configs[f"learned {name}"] = dataclasses.replace(base, filters=[LearnedFilter(weights=path)])
        configs[f"learned {name} + eotp"] = dataclasses.replace(base, filters=[LearnedFilter(weights=path),
                                                                               EoTPFilter()])
    return side_by_side({"model": model}, configs, suite_examples(per_task, seed), progress=progress)


@click.command("onpolicy", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "model_name", default="embedded", show_default=True, help="The diffusion model.")
@click.option("--weights", multiple=True, required=True, metavar="NAME=PATH",
              help="A filter to compare (repeatable); PATH `embedded` is the shipped one.")
@click.option("--per-task", type=click.IntRange(1), default=4, show_default=True,
              help="Test-split prompts per task.")
@click.option("--gen-length", type=click.IntRange(1), default=256, show_default=True)
@click.option("--threads", type=click.IntRange(1, CORES), default=1, show_default=True,
              help="torch threads (batch-1 decoding of a small model).")
def main(model_name: str, weights: tuple[str, ...], per_task: int, gen_length: int, threads: int) -> None:
    """Learn2PD filters side by side: one token per step vs learned + eotp under each --weights
    NAME=PATH (test split, batch 1). Prints the table, then the same as JSON."""
    import json

    from dllm_decode.eval.training.side_by_side import command_model, format_table

    named: dict[str, str] = {}
    for item in weights:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise click.BadParameter(f"expected NAME=PATH, got {item!r}", param_hint="--weights")
        named[name.strip()] = path.strip()
    torch.set_num_threads(threads)
    model = command_model(model_name)
    try:
        table = compare_filters(model, named, per_task=per_task, gen_length=gen_length,
                                progress=lambda line: click.echo(line, err=True))
    except ValueError as err:                          # a weights file that does not load
        raise click.BadParameter(str(err).splitlines()[0], param_hint="--weights") from None
    click.echo(format_table(table))
    click.echo(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
