"""`dllm-decode train-filter`: train the Learn2PD filter on the task suite's train split."""

from __future__ import annotations

import json

import click

from dllm_decode.cli.decode import DEFAULT_MODEL
from dllm_decode.cli.options import FloatRange


@click.command("train-filter")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True,
              help="The model whose own one-token-per-step outputs the filter learns.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Weights file to write (safetensors).")
@click.option("--per-task", type=click.IntRange(1), default=20, show_default=True,
              help="Train-split prompts per task (a tenth is held out for the report).")
@click.option("--gen-length", type=click.IntRange(1), default=256, show_default=True)
@click.option("--block-length", type=click.IntRange(1), default=32, show_default=True)
@click.option("--width", type=click.IntRange(1), default=32, show_default=True, help="Filter input width.")
@click.option("--epochs", type=click.IntRange(1), default=2000, show_default=True)
@click.option("--threshold", type=FloatRange(0, 1), default=0.96, show_default=True,
              help="Accept threshold the held-out report uses.")
@click.option("--trajectory", type=click.Choice(["baseline", "oracle", "both"]), default="baseline",
              show_default=True, help="Log steps of the reference decode, of the oracle, or both.")
@click.option("--rounds", type=click.IntRange(0), default=0, show_default=True,
              help="On-policy (DAgger) rounds after the first fit: decode the prompts under the filter "
                   "itself (+ EoTP), log its states against the reference, retrain on all data.")
@click.option("--beta", type=FloatRange(0, 1), default=0.5, show_default=True,
              help="Share of a round's steps that take the oracle's commits (round r: beta * decay^(r-1)).")
@click.option("--beta-decay", type=FloatRange(0, 1), default=0.5, show_default=True)
@click.option("--balance/--no-balance", default=False, show_default=True,
              help="Weight positive and negative slots equally in the loss.")
@click.option("--rollout-eotp/--no-rollout-eotp", default=True, show_default=True,
              help="Run EoTP after the filter in the rounds' rollouts (as deployed with `--filter eotp`).")
@click.option("--save-rounds", is_flag=True,
              help="Also write each round's filter as OUT's stem + .round<r>.safetensors (0: before round 1).")
@click.option("--seed", type=click.IntRange(0, 2 ** 63 - 1), default=0, show_default=True)
@click.option("--device", default=None, help="torch device (default: cpu).")
def train_filter_command(model_name: str, out: str, per_task: int, gen_length: int, block_length: int,
                         width: int, epochs: int, threshold: float, trajectory: str, rounds: int,
                         beta: float, beta_decay: float, balance: bool, rollout_eotp: bool, save_rounds: bool,
                         seed: int,
                         device: str | None) -> None:
    """Train the Learn2PD filter (`--filter learned:weights=OUT`) on the task suite's train split."""
    from dllm_decode.cli.options import (device_option, load_diffusion_model, model_spec,
                                         usage_errors, writable_file)
    from dllm_decode.eval.training.filter import task_prompts, train_filter

    from dllm_decode.outputs import write_errors

    writable_file(out, "--out")
    model = load_diffusion_model(model_spec(model_name), device_option(device))
    with usage_errors(), write_errors():          # a full disk is one line (exit 1), not a traceback
        _, report = train_filter(model, task_prompts(per_task, seed), gen_length=gen_length,
                                 block_length=block_length, width=width, epochs=epochs,
                                 threshold=threshold, trajectory=trajectory, rounds=rounds, beta=beta,
                                 beta_decay=beta_decay, balance=balance, seed=seed, out=out,
                                 rollout_eotp=rollout_eotp, save_rounds=save_rounds,
                                 progress=lambda line: click.echo(line, err=True))
    click.echo(json.dumps({"model": model_name, "out": out, **report}, indent=1))
