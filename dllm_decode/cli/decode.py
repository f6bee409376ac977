"""The main command: decode one prompt (`dllm-decode --prompt ...`), the group's own options;
`--input`/`--output` (a JSONL file of requests) and `--stream` hand over to `cli.batch`."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import click

from dllm_decode.cli.launch import tensor_parallel_option
from dllm_decode.cli.adapters import adapter_option, split_adapters
from dllm_decode.cli.attention import attention_option
from dllm_decode.cli.options import (DTYPES, RegistryHelp, key_values, kv_cache_dtype_option, quantize_option, registry_names, runtime_option,
                                     trust_option)
from dllm_decode.cli.self_decoding import self_decoder_options

DEFAULT_MODEL = "embedded"
DEFAULT_SCHEDULER = "threshold"
DEFAULT_BLOCK = 32
FALLBACK_GEN_LENGTH = 128
"""The canvas when neither `--gen-length` nor the model (`generation_config.json`) names one."""

PRESET_HELP = ("A decoding preset: a hand-written NAME, a `dllm-decode tune` presets.json FILE (its `overall`) "
               "or FILE:NAME (one task's); NAME alone also looks in the file $DLLM_DECODE_PRESETS names. It sets "
               "the scheduler, cache, filters and the block length it was tuned at; a tuned preset is refused "
               "for another model.")
RECORD_PARTS = ("scheduler", "scheduler_opts", "cache_name", "cache_opts", "filter_specs")
"""The options a preset fixes (giving one of them with --preset is a usage error)."""

MODEL_HELP = ("A checkpoint directory, an HF repo id ORG/NAME (from the local cache, else downloaded; "
              "HF_HUB_OFFLINE=1: cache only), a shipped name (`embedded`), `ideal[:noise=X]` or `tiny`.")


def _apply(command: Callable[..., Any], options: list[Any]) -> Callable[..., Any]:
    for option in reversed(options):
        command = option(command)
    return command


def record_options(command: Callable[..., Any], model_help: str = MODEL_HELP) -> Callable[..., Any]:
    """The model and decode-record options (`dllm-decode` and `dllm-decode serve` share them)."""
    return _apply(command, [
        click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True, help=model_help),
        click.option("--scheduler", default=DEFAULT_SCHEDULER, show_default=True, cls=RegistryHelp,
                     help=lambda: f"Unmasking policy: {registry_names('scheduler')} (`dllm-decode "
                                  f"list` shows each one's fields); NAME[:KEY=VALUE,...] sets fields "
                                  f"inline."),
        click.option("-o", "--scheduler-opt", "scheduler_opts", multiple=True, metavar="KEY=VALUE",
                     callback=key_values,
                     help="Set a scheduler field (dotted for a wrapper's base: base.kappa=0.8); repeatable."),
        click.option("--cache", "cache_name", default="none", show_default=True, cls=RegistryHelp,
                     help=lambda: f"How logits are obtained: {registry_names('cache')} (which fit a "
                                  f"model: docs' compatibility matrix); NAME[:KEY=VALUE,...] sets "
                                  f"fields inline (`dllm-decode list`)."),
        click.option("-c", "--cache-opt", "cache_opts", multiple=True, metavar="KEY=VALUE",
                     callback=key_values, help="Set a cache field (refresh policy); repeatable."),
        click.option("--filter", "filter_specs", multiple=True, metavar="NAME[:KEY=VALUE,...]",
                     cls=RegistryHelp,
                     help=lambda: f"Add a filter ({registry_names('filter')}); repeatable, applied in order."),
        click.option("--preset", default=None, metavar="NAME|FILE[:NAME]", help=PRESET_HELP),
        self_decoder_options,
        click.option("--gen-length", type=int, default=None,
                     help=f"Canvas length [the model's own: max_new_tokens in its "
                          f"generation_config.json (32 for the embedded models); else "
                          f"{FALLBACK_GEN_LENGTH}]."),
        click.option("--block-length", type=int, default=None,
                     help="Semi-AR block [32; a block-diffusion model's own block size]."),
        click.option("--temperature", type=float, default=0.0, show_default=True),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--chat-template/--no-chat-template", default=True, show_default=True,
                     help="Apply the tokenizer's chat template when it has one."),
        click.option("--device", default=None, help="torch device (default: cpu)."),
        click.option("--dtype", type=click.Choice(DTYPES), default=None),
        trust_option,
        runtime_option,
        adapter_option,
        quantize_option,
        attention_option,
        kv_cache_dtype_option,
    ])


view_options = [
    click.option("--show", is_flag=True,
                 help="Animate the canvas step by step (masked, provisional, committed, revised) "
                      "with rich (the `viz` extra); plain lines when stdout is not a terminal."),
    click.option("--trace-html", "trace_html", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                 help="Write a self-contained HTML page replaying the decode with a step slider."),
]


def decode_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The decoding options (the same on the group as `dllm-decode` takes them)."""
    from dllm_decode.cli.options import capture_options

    return _apply(capture_options(record_options(command)), [
        click.option("--prompt", default=None, help="Prompt text; read from stdin when omitted."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object."),
        click.option("--stream", is_flag=True,
                     help="Print the answer as it becomes final (committed up to the first masked "
                          "position), not at the end."),
        click.option("--input", "input_path", type=click.Path(dir_okay=False), default=None,
                     help="A JSONL file of requests, one a line: {\"id\", \"prompt\"} plus optional "
                          "max_tokens, temperature, seed and a `dllm` object as the server takes it."),
        click.option("--output", "output_path", type=click.Path(dir_okay=False), default=None,
                     help="With --input: append one JSON result a line; a re-run skips ids already there."),
        click.option("--batch-size", type=click.IntRange(1), default=8, show_default=True,
                     help="With --input: requests decoded at once (continuous batching)."),
        tensor_parallel_option,
        *view_options,
    ])


def record_preset(text: str | None, spec: Any) -> Any:
    """The `--preset` the user named (None when none), checked against the model `spec` names;
    a preset with any of the options it fixes given explicitly is a usage error."""
    if text is None:
        return None
    from dllm_decode.cli.options import usage_errors
    from dllm_decode.eval.harness.presets import find_preset, identity_of

    context = click.get_current_context(silent=True)
    if context is not None:
        given = [name for name in RECORD_PARTS
                 if context.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)]
        if given:
            flag = {"scheduler_opts": "-o", "cache_name": "--cache", "cache_opts": "-c",
                    "filter_specs": "--filter"}.get(given[0], f"--{given[0]}")
            raise click.UsageError(f"--preset fixes the scheduler, cache and filters; drop {flag} (or --preset)")
    with usage_errors("--preset"):
        return find_preset(text, identity_of(spec))


def decode_record(*, scheduler: str, scheduler_opts: dict[str, str], cache_name: str,
                  cache_opts: dict[str, str], filter_specs: tuple[str, ...], gen_length: int,
                  block_length: int | None, temperature: float, seed: int, preset: Any = None) -> Any:
    """The `DecodeConfig` the record options describe (bad parts are usage errors), or the
    `preset`'s (a `Preset` from `record_preset`) with these lengths, temperature and seed. An
    unset block length is the preset's, else 32 (or the whole canvas when shorter), an unset gen
    length 128, until `for_model` sees the model."""
    from dllm_decode.cli.options import decode_config, usage_errors

    gen_length = FALLBACK_GEN_LENGTH if gen_length is None else gen_length
    if preset is not None and not isinstance(preset, str):
        block = block_length if block_length is not None else preset.parts.get("block_length")
        sampling = preset_sampling(preset, temperature=temperature, seed=seed)
        with usage_errors("--preset"):
            return preset.config(gen_length=gen_length, block_length=min(DEFAULT_BLOCK, gen_length) if block is None
                                 else block, **sampling)
    return decode_config(scheduler=scheduler, scheduler_options=scheduler_opts, cache=cache_name,
                         cache_options=cache_opts, filters=filter_specs, gen_length=gen_length,
                         block_length=block_length if block_length is not None else min(DEFAULT_BLOCK, gen_length),
                         temperature=temperature, seed=seed)


def shipped_wanted() -> bool:
    """True when the running command named no scheduler, scheduler option or preset: the
    model's shipped decoding (`DecodeConfig.for_model`) then applies."""
    context = click.get_current_context(silent=True)
    if context is None or "scheduler" not in context.params:     # a command with its own choice
        return False
    given = [context.get_parameter_source(name) for name in ("scheduler", "scheduler_opts", "preset")]
    return all(source in (None, click.core.ParameterSource.DEFAULT) for source in given)


def shipped_for(config: Any, model: Any, block_given: bool) -> Any:
    """`config` with the model's shipped scheduler (and its block, unless the user gave one);
    the user's cache, filters, temperature and seed kept. A model that ships none (no known
    family, no checkpoint) keeps the CLI's default."""
    from dllm_decode.cli.options import usage_errors
    from dllm_decode.config import DecodeConfig

    try:
        shipped = DecodeConfig.for_model(model, gen_length=config.gen_length)
    except ValueError:
        return config
    with usage_errors("--scheduler"):
        return dataclasses.replace(
            shipped, cache=config.cache, filters=config.filters, temperature=config.temperature,
            seed=config.seed, block_length=config.block_length if block_given else shipped.block_length)


def preset_sampling(preset: Any, **given: Any) -> dict[str, Any]:
    """`temperature` and `seed` for a preset's record: the preset's own where it fixes them and
    the command line leaves them at their defaults; a value given on the command line that
    differs from the preset's is applied and reported on standard error (never silently)."""
    context = click.get_current_context(silent=True)
    out = dict(given)
    for name, value in given.items():
        if name not in preset.parts:
            continue
        source = context.get_parameter_source(name) if context is not None else None
        if source in (None, click.core.ParameterSource.DEFAULT):
            out[name] = preset.parts[name]
        elif preset.parts[name] != value:
            click.echo(f"note: --{name} {value} overrides the preset's {name} {preset.parts[name]}", err=True)
    return out


def for_model(config: Any, model: Any, block_given: bool = True, gen_given: bool | None = None,
              shipped: bool = False) -> Any:
    """The record fitted to the loaded model: the model's natural generation length when the
    user gave none (`gen_given`; None: read from the running command's `--gen-length`), a
    block-diffusion model's own block when the user gave none, the model's shipped scheduler
    when asked (`shipped`: the command's own record when it named no scheduler,
    `shipped_wanted`; never a preset's or a request's, which chose theirs), and AdaBlock's
    delimiters (tokenizer ids) filled from its tokenizer."""
    from dllm_decode.cli.options import natural_gen_length, usage_errors
    from dllm_decode.schedulers import with_delimiters

    if gen_given is None:
        context = click.get_current_context(silent=True)
        gen_given = context is None or context.params.get("gen_length", 0) is not None
    natural = None if gen_given else natural_gen_length(model)
    if natural is not None and natural != config.gen_length:
        block = config.block_length if block_given else min(DEFAULT_BLOCK, natural)
        with usage_errors("--gen-length"):
            config = dataclasses.replace(config, gen_length=natural, block_length=block)

    own_block = getattr(model, "block_size", None) or getattr(model, "canvas_length", None)
    if not block_given and own_block:       # a block-diffusion block, a noise model's canvas
        with usage_errors("--block-length"):
            config = dataclasses.replace(config, block_length=own_block)
    if shipped:
        config = shipped_for(config, model, block_given)
    tokenizer = getattr(model, "tokenizer", None)
    return dataclasses.replace(config, scheduler=with_delimiters(config.scheduler, tokenizer))


def run_decode(*, model_name: str, prompt: str | None, chat_template: bool, device: str | None,
               dtype: str | None, as_json: bool, stream: bool, input_path: str | None,
               output_path: str | None, batch_size: int, trust_remote_code: bool = False,
               runtime: str | None = None, cuda_graphs: bool = False, compile_step: bool = False,
               tensor_parallel: int = 1, show: bool = False, trace_html: str | None = None,
               adapter: tuple[str, ...] = (), quantize: str | None = None, attention: str | None = None,
               kv_cache_dtype: str = "auto", **record: Any) -> None:
    """Decode one prompt and print the answer (or one JSON object); or run a requests file.

    Under `torchrun` with `--tensor-parallel N` (world size N) every rank runs this; TP rank 0
    prints and writes the output file, the others decode the same requests silently.
    """
    from dllm_decode.cli import batch, launch
    from dllm_decode.cli.options import (capture_mode, device_option, load_diffusion_model,
                                         model_spec, read_prompt)
    from dllm_decode.cli.self_decoding import build_self_decoder, preset_self_decoder, refuse_with
    from dllm_decode.runkey import load_identity

    if (input_path is None) != (output_path is None):
        raise click.UsageError("--input and --output go together")
    if input_path is not None and (stream or as_json or prompt is not None):
        raise click.UsageError("--input takes no --prompt, --stream or --json (results go to --output)")
    if stream and as_json:
        raise click.UsageError("--stream prints text; drop --json")
    views = _views(show, trace_html, input_path, stream, as_json)
    selfdec = build_self_decoder(record.pop("self_decoder"), record.pop("self_decoder_opts"))
    spec = model_spec(model_name)
    if trace_html is not None:
        _not_an_input(trace_html, str(spec), adapter)
    preset = record_preset(record.pop("preset", None), spec)
    selfdec = preset_self_decoder(preset, selfdec)
    refuse_with(selfdec, {"--input": input_path is not None, "--stream": stream, "--show": show,
                          "--trace-html": trace_html is not None, "--cuda-graphs": cuda_graphs,
                          "--compile": compile_step, "--tensor-parallel": tensor_parallel > 1,
                          "--attention": attention is not None})
    config = decode_record(**record, preset=preset)
    if launch.check_world(tensor_parallel, "dllm-decode") > 1 and input_path is None and prompt is None:
        raise click.UsageError("under torchrun give the prompt with --prompt (standard input "
                               "reaches one process only)")
    leader = os.environ.get("RANK", "0") == "0"
    if input_path is not None:
        requests = batch.read_requests(input_path, output_path) if leader else \
            batch.read_lines(input_path)
        text = None
    else:
        text = read_prompt(prompt)
    where = device_option(device)
    capture = capture_mode(cuda_graphs, compile_step, where, spec)
    block_given = record["block_length"] is not None or (preset is not None and "block_length" in preset.parts)
    groups = launch.start(tensor_parallel, where, "dllm-decode", spec=spec)
    try:
        launch.agree(groups, model=str(spec), config=config.to_dict(), prompt=text,
                     requests=batch.read_lines(input_path) if input_path else None)
        model = load_diffusion_model(spec, where, dtype, config.gen_length,
                                     trust_remote_code=trust_remote_code, runtime=runtime,
                                     tensor_parallel=tensor_parallel, quantize=quantize,
                                     adapter=split_adapters(adapter, named_ok=False).merged,
                                     attention=attention, kv_cache_dtype=kv_cache_dtype)
        with launch.leader_speaks(groups):
            _decode_loaded(model, spec, config, block_given, text, requests if input_path else None,
                           output_path, chat_template, batch_size, stream, as_json, where, groups,
                           capture, views, load_identity(quantize, split_adapters(adapter, named_ok=False).merged,
                                                         dtype, chat_template, attention, kv_cache_dtype), selfdec)
    finally:
        launch.finish(groups)


def _decode_loaded(model: Any, spec: Any, config: Any, block_given: bool, text: str | None,
                   requests: Any, output_path: str | None, chat_template: bool, batch_size: int,
                   stream: bool, as_json: bool, where: Any, groups: Any, capture: str,
                   views: Any = None, load: Any = None, selfdec: Any = None) -> None:
    import torch

    from dllm_decode.cli import batch
    from dllm_decode.cli.options import usage_errors
    from dllm_decode.prompts import chat_prompt
    from dllm_decode.sampler import generate

    tokenizer = getattr(model, "tokenizer", None)
    config = for_model(config, model, block_given=block_given, shipped=shipped_wanted())
    if requests is not None:
        batch.run_requests(model, config, requests, output_path, chat_template, batch_size,
                           str(spec), groups=groups, capture=capture, load=load)
        return
    with usage_errors("--prompt"):
        wrapped = chat_prompt(tokenizer, text, chat_template)
    if stream:
        batch.stream_one(model, config, wrapped, capture=capture)
        return
    generator = torch.Generator(device=where).manual_seed(config.seed)
    extra: dict[str, Any] = {}
    if selfdec is not None:
        from dllm_decode.cli.self_decoding import check_self_decoder
        from dllm_decode.registry import component_dict

        check_self_decoder(selfdec, model, config)
        with usage_errors():
            out = selfdec.decode(model, [wrapped], config, generator=generator, tokenizer=tokenizer)
        result = out.result
        extra = {"self_decoder": component_dict(selfdec), "verifies": int(out.verifies[0])}
    else:
        with usage_errors():
            result = generate(model, [wrapped], config, capture=capture, trace=views is not None,
                              generator=generator)
    if views is not None:
        views.present(result, tokenizer, text)
        if views.show:
            return
    answer = result.text[0] if result.text is not None else " ".join(map(str, result.tokens[0].tolist()))
    if not as_json:
        click.echo(answer)
        return
    click.echo(json.dumps({
        "text": answer, "tokens": result.tokens[0].tolist(), "nfe": int(result.nfe[0]),
        "tokens_per_step": float(result.tokens_per_step[0]),
        "answer_tokens_per_step": float(result.answer_tokens_per_step[0]),
        "seconds": result.seconds, "model": str(spec), "config": config.to_dict(), **extra,
    }))


def _not_an_input(trace_html: str, model_name: str, adapters: tuple[str, ...]) -> None:
    """--trace-html may not land on the model's or an adapter's files (it would replace them)."""
    from dllm_decode.outputs import OutputError, check_not_input
    from dllm_decode.runkey import model_directory

    folders = [model_directory(model_name), *(value.partition("=")[2] or value for value in adapters)]
    try:
        check_not_input(trace_html, folders, "--trace-html file")
    except OutputError as err:
        raise click.BadParameter(str(err), param_hint="--trace-html") from None


def _views(show: bool, trace_html: str | None, input_path: str | None, stream: bool, as_json: bool) -> Any:
    """The `--show`/`--trace-html` request (None when neither), its conflicts usage errors and
    the HTML path checked before any work."""
    if not show and trace_html is None:
        return None
    from dllm_decode.viz.cli_views import Views

    flag = "--show" if show else "--trace-html"
    if input_path is not None or stream:
        raise click.UsageError(f"{flag} shows one decoded prompt; drop {'--input' if input_path else '--stream'}")
    if show and as_json:
        raise click.UsageError("--show animates the canvas on stdout; drop --json (--trace-html FILE keeps a record)")
    return Views.checked(show, trace_html)
