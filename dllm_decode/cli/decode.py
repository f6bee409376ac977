"""The main command: decode one prompt (`dllm-decode --prompt ...`), the group's own options."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import click

from dllm_decode.cli.options import DTYPES, key_values, trust_option

DEFAULT_MODEL = "embedded"
DEFAULT_SCHEDULER = "threshold"
DEFAULT_BLOCK = 32

MODEL_HELP = ("A checkpoint directory, an HF repo id in the local cache, a shipped name "
              "(`embedded`), `ideal[:noise=X]` or `tiny`.")


def decode_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The decoding options (the same on the group as `dllm-decode` takes them)."""
    options = [
        click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True, help=MODEL_HELP),
        click.option("--scheduler", default=DEFAULT_SCHEDULER, show_default=True,
                     help="Unmasking policy (`dllm-decode list` shows every one with its fields)."),
        click.option("-o", "--scheduler-opt", "scheduler_opts", multiple=True, metavar="KEY=VALUE",
                     callback=key_values,
                     help="Set a scheduler field (dotted for a wrapper's base: base.kappa=0.8); repeatable."),
        click.option("--cache", "cache_name", default="none", show_default=True,
                     help="How logits are obtained: none, prefix, dual (`dllm-decode list`)."),
        click.option("-c", "--cache-opt", "cache_opts", multiple=True, metavar="KEY=VALUE",
                     callback=key_values, help="Set a cache field (refresh policy); repeatable."),
        click.option("--filter", "filter_specs", multiple=True, metavar="NAME[:KEY=VALUE,...]",
                     help="Add a filter (learned, eotp); repeatable, applied in order."),
        click.option("--gen-length", type=int, default=128, show_default=True),
        click.option("--block-length", type=int, default=None,
                     help="Semi-AR block [32; a block-diffusion model's own block size]."),
        click.option("--temperature", type=float, default=0.0, show_default=True),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--prompt", default=None, help="Prompt text; read from stdin when omitted."),
        click.option("--chat-template/--no-chat-template", default=True, show_default=True,
                     help="Apply the tokenizer's chat template when it has one."),
        click.option("--device", default=None, help="torch device (default: cpu)."),
        click.option("--dtype", type=click.Choice(DTYPES), default=None),
        trust_option,
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def run_decode(*, model_name: str, scheduler: str, scheduler_opts: dict[str, str], cache_name: str,
               cache_opts: dict[str, str], filter_specs: tuple[str, ...], gen_length: int,
               block_length: int | None, temperature: float, seed: int, prompt: str | None,
               chat_template: bool, device: str | None, dtype: str | None, as_json: bool,
               trust_remote_code: bool = False) -> None:
    """Decode one prompt and print the answer (or one JSON object)."""
    import torch

    from dllm_decode.cli.options import (decode_config, device_option, load_diffusion_model,
                                         model_spec, read_prompt, usage_errors)
    from dllm_decode.prompts import chat_prompt
    from dllm_decode.sampler import generate
    from dllm_decode.schedulers import with_delimiters

    spec = model_spec(model_name)
    config = decode_config(scheduler=scheduler, scheduler_options=scheduler_opts, cache=cache_name,
                           cache_options=cache_opts, filters=filter_specs, gen_length=gen_length,
                           block_length=block_length if block_length is not None else min(DEFAULT_BLOCK, gen_length),
                           temperature=temperature, seed=seed)
    text = read_prompt(prompt)
    where = device_option(device)
    model = load_diffusion_model(spec, where, dtype, gen_length, trust_remote_code=trust_remote_code)
    tokenizer = getattr(model, "tokenizer", None)
    if block_length is None and getattr(model, "block_size", None):      # block diffusion: its block
        with usage_errors("--block-length"):
            config = dataclasses.replace(config, block_length=model.block_size)
    # AdaBlock's delimiters are tokenizer ids: fill an empty `delimiter_ids` from this model's.
    config = dataclasses.replace(config, scheduler=with_delimiters(config.scheduler, tokenizer))
    with usage_errors():
        result = generate(model, [chat_prompt(tokenizer, text, chat_template)], config,
                          generator=torch.Generator(device=where).manual_seed(seed))
    answer = result.text[0] if result.text is not None else " ".join(map(str, result.tokens[0].tolist()))
    if not as_json:
        click.echo(answer)
        return
    click.echo(json.dumps({
        "text": answer, "tokens": result.tokens[0].tolist(), "nfe": int(result.nfe[0]),
        "tokens_per_step": float(result.tokens_per_step[0]),
        "answer_tokens_per_step": float(result.answer_tokens_per_step[0]),
        "seconds": result.seconds, "model": str(spec), "config": config.to_dict(),
    }))
