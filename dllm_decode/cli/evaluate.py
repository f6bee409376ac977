"""`dllm-decode eval`: schedulers on ParallelBench-style tasks, resumable and data-parallel."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from dllm_decode.cli.decode import DEFAULT_MODEL
from dllm_decode.cli.launch import tensor_parallel_option
from dllm_decode.cli.adapters import adapter_option, split_adapters
from dllm_decode.cli.attention import attention_option
from dllm_decode.cli.self_decoding import self_decoder_eval_options
from dllm_decode.cli.options import (DTYPES, MAX_CANVAS, MAX_PROMPTS, RegistryHelp, capture_options, key_values,
                                     kv_cache_dtype_option, registry_names, quantize_option,
                                     runtime_option, trust_option)

EVAL_MODEL_HELP = ("As for decoding (a checkpoint directory, HF repo id, `embedded`, `ideal[:noise=X]`, "
                   "`tiny`), or `ar:TARGET[+DRAFT][@compact]` for the AR (speculative) baseline.")


def command_line() -> str:
    """This command as the user would type it again: `dllm-decode` and the arguments given, not
    the absolute path of the venv's executable (`sys.argv[0]`) or of `__main__.py`."""
    import shlex

    return shlex.join(["dllm-decode", *sys.argv[1:]])


@click.command("eval")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True, help=EVAL_MODEL_HELP)
@click.option("--tasks", "selection", multiple=True, default=("all",), show_default=True,
              help="Comma list of task names, groups (all, waiting_line, puzzles) or "
                   "released:DIR[#task+task] (ParallelBench's released output/test directory); "
                   "repeatable, the selections add up.")
@click.option("--preset", "preset_specs", multiple=True, metavar="NAME|FILE[:NAME]",
              help="A decoding preset as one more point (hand-written NAME, a `dllm-decode tune` presets.json "
                   "FILE or FILE:NAME); repeatable. With --preset alone, only the presets run.")
@click.option("--scheduler", "scheduler_specs", multiple=True, default=("threshold",), show_default=True,
              metavar="NAME[:KEY=VALUE,...]", cls=RegistryHelp,
              help=lambda: f"One of {registry_names('scheduler')}; repeatable, each one is a curve "
                           f"(or a point).")
@click.option("-o", "--scheduler-opt", "scheduler_opts", multiple=True, metavar="KEY=VALUE",
              callback=key_values, help="Set a field on every scheduler that has it; repeatable.")
@click.option("--sweep", "sweep_specs", multiple=True, metavar="KEY=V1,V2,...",
              help="Sweep a scheduler field, tokens_per_step, block_length, gen_length, temperature "
                   "or cache.FIELD; repeatable (product).")
@click.option("--cache", "cache_name", default="none", show_default=True, cls=RegistryHelp,
              help=lambda: f"One of {registry_names('cache')}; NAME[:KEY=VALUE,...] sets fields inline.")
@click.option("-c", "--cache-opt", "cache_opts", multiple=True, metavar="KEY=VALUE", callback=key_values,
              help="Set a cache field; repeatable.")
@click.option("--filter", "filter_specs", multiple=True, metavar="NAME[:KEY=VALUE,...]", cls=RegistryHelp,
              help=lambda: f"Add a filter ({registry_names('filter')}); repeatable, applied in order.")
@self_decoder_eval_options
@click.option("--limit", type=click.IntRange(1, MAX_PROMPTS), default=None, help="Examples per task [100 / whole file].")
@click.option("--gen-length", default="32", show_default=True,
              help="Canvas length, or `answer` for each example's reference length (infilling).")
@click.option("--block-length", type=click.IntRange(1), default=None, help="Semi-AR block [whole canvas].")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--seed", type=click.IntRange(0, 2 ** 63 - 1), default=0, show_default=True,
              help="Decoding seed.")
@click.option("--data-seed", type=click.IntRange(0, 2 ** 63 - 1), default=0, show_default=True,
              help="Seed of the built-in tasks.")
@click.option("--sort-by", type=click.Choice(["first", "last"]), default="first", show_default=True,
              help="Released Sort labels: by first name (as released) or last name (as the prompt asks).")
@click.option("--released-scoring", type=click.Choice(["parallelbench", "parallelbench_strict", "lenient"]),
              default="parallelbench", show_default=True,
              help="Released list/puzzle outputs: ParallelBench's own `score` rule for rule, its "
                   "`score_strict`, or this package's lenient reading (strips single quotes, reads "
                   "every digit of a Sudoku).")
@click.option("--batch-size", type=click.IntRange(1), default=8, show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Results directory; re-running the same command resumes there.")
@click.option("--chat-template/--no-chat-template", default=True, show_default=True)
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Progress on stderr: a bar on a terminal, otherwise a log line every 30 s.")
@click.option("--plots/--no-plots", default=True, show_default=True)
@click.option("--device", default=None)
@click.option("--dtype", type=click.Choice(DTYPES), default=None)
@trust_option
@runtime_option
@adapter_option
@quantize_option
@attention_option
@kv_cache_dtype_option
@capture_options
@click.option("--combine", is_flag=True,
              help="Summarize every run recorded in --out (e.g. a dLLM run and an `ar:` run of the "
                   "same tasks), not only this command's; labels then name their model.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@tensor_parallel_option
def eval_command(model_name: str, selection: tuple[str, ...], preset_specs: tuple[str, ...],
                 scheduler_specs: tuple[str, ...],
                 scheduler_opts: dict[str, str], sweep_specs: tuple[str, ...], cache_name: str,
                 cache_opts: dict[str, str], filter_specs: tuple[str, ...],
                 self_decoder_specs: tuple[str, ...], self_decoder_opts: dict[str, str], limit: int | None,
                 gen_length: str, block_length: int | None, temperature: float, seed: int,
                 data_seed: int, sort_by: str, released_scoring: str, batch_size: int, out_dir: str,
                 chat_template: bool,
                 progress: bool, plots: bool, device: str | None, dtype: str | None,
                 trust_remote_code: bool, runtime: str | None, combine: bool, as_json: bool,
                 tensor_parallel: int = 1, cuda_graphs: bool = False, compile_step: bool = False,
                 adapter: tuple[str, ...] = (), quantize: str | None = None,
                 attention: str | None = None, kv_cache_dtype: str = "auto") -> None:
    """Evaluate schedulers on ParallelBench-style tasks: samples.jsonl, summary.json, report.md,
    plots. Runs data-parallel under torchrun (samples sharded by rank, merged by rank 0); with
    --tensor-parallel T on a world of T x D processes, D data-parallel groups of T ranks."""
    from dllm_decode.cli import launch
    from dllm_decode.cli.options import (capture_mode, device_option, model_spec, parse_spec, usage_errors,
                                         writable_dir)
    from dllm_decode.eval.harness import distributed
    from dllm_decode.eval.harness.grid import ANSWER, expand_grid, parse_sweep, with_self_decoders
    from dllm_decode.eval.tasks.sources import select_tasks

    spec = model_spec(model_name)
    if spec.kind == "ar" and (cache_name != "none" or cache_opts or filter_specs):
        raise click.UsageError(f"--cache and --filter apply to diffusion models; {model_name!r} "
                               f"is the AR baseline (it has neither)")
    if gen_length != ANSWER and not (gen_length.isascii() and gen_length.isdigit() and 1 <= int(gen_length) <= MAX_CANVAS):
        raise click.BadParameter(f"expected an integer in [1, {MAX_CANVAS}] or {ANSWER!r}, got {gen_length!r}",
                                 param_hint="--gen-length")
    with usage_errors("--cache"):
        cache_name, inline = parse_spec(cache_name)       # `--cache elastic:track_num=4` too
        cache_opts = {**inline, **cache_opts}
    with usage_errors("--filter"):
        filters = tuple((name, tuple(sorted(options.items())))
                        for name, options in map(parse_spec, filter_specs))
    with usage_errors():
        settings = expand_grid([parse_spec(text) for text in scheduler_specs], scheduler_opts,
                               [parse_sweep(text) for text in sweep_specs], cache=cache_name,
                               cache_options=tuple(sorted(cache_opts.items())), filters=filters,
                               gen_length=None if gen_length == ANSWER else int(gen_length),
                               block_length=block_length, temperature=temperature, seed=seed)
        runs, skipped = select_tasks(",".join(selection), limit, data_seed, sort_by, released_scoring)
    with usage_errors("--self-decoder / -s"):
        settings = with_self_decoders(settings, [parse_spec(text) for text in self_decoder_specs],
                                      self_decoder_opts)
    if tensor_parallel > 1 and any(s.self_decoder != "none" for s in settings):
        raise click.UsageError("--self-decoder runs its own rounds on one process's model; drop "
                               "--tensor-parallel (data-parallel ranks under torchrun are fine)")
    if preset_specs:
        from dllm_decode.cli.decode import preset_sampling
        from dllm_decode.eval.harness.presets import find_preset, identity_of, preset_setting

        with usage_errors("--preset"):
            identity = identity_of(spec)
            found = [find_preset(text, identity) for text in preset_specs]
            presets = [preset_setting(preset, gen_length=None if gen_length == ANSWER else int(gen_length),
                                      block_length=block_length,
                                      **preset_sampling(preset, temperature=temperature, seed=seed))
                       for preset in found]
        source = click.get_current_context().get_parameter_source("scheduler_specs")
        settings = presets if source == click.core.ParameterSource.DEFAULT else [*settings, *presets]
    if spec.kind == "ideal":                     # refuse before decoding what it cannot read
        from dllm_decode.eval.theory.ideal import check_prompts

        with usage_errors("--model"):
            for run in runs:
                check_prompts(run.name, (example.prompt for example in run.examples))
    where = device_option(device)
    capture = capture_mode(cuda_graphs, compile_step, where, spec)
    writable_dir(out_dir, "--out")
    adapters = split_adapters(adapter, named_ok=False).merged
    if tensor_parallel == 1:
        rank, _ = distributed.init_from_env(str(where))
        _evaluate(spec, where, dtype, chat_template, trust_remote_code, runtime, 1, rank, skipped,
                  settings, runs, out_dir, batch_size, progress, combine, plots, as_json, capture,
                  adapters=adapters, quantize=quantize, attention=attention, kv_cache_dtype=kv_cache_dtype)
        return
    groups = launch.start(tensor_parallel, where, "eval", data_parallel=True, spec=spec)
    try:
        launch.agree(groups, model=str(spec), settings=[s.to_dict() for s in settings],
                     runs=[(r.name, [e.prompt for e in r.examples]) for r in runs])
        _evaluate(spec, where, dtype, chat_template, trust_remote_code, runtime, tensor_parallel,
                  groups.rank, skipped, settings, runs, out_dir, batch_size, progress, combine,
                  plots, as_json, capture, adapters=adapters, quantize=quantize, attention=attention,
                  kv_cache_dtype=kv_cache_dtype)
    finally:
        launch.finish(groups)


def _evaluate(spec: Any, where: Any, dtype: str | None, chat_template: bool,
              trust_remote_code: bool, runtime: str | None, tensor_parallel: int, rank: int,
              skipped: Any, settings: Any, runs: Any, out_dir: str, batch_size: int,
              progress: bool, combine: bool, plots: bool, as_json: bool, capture: str = "off",
              adapters: tuple[str, ...] = (), quantize: str | None = None,
              attention: str | None = None, kv_cache_dtype: str = "auto") -> None:
    from dllm_decode.cli.options import torch_dtype, usage_errors
    from dllm_decode.eval.harness import distributed
    from dllm_decode.eval.harness.records import combined_records
    from dllm_decode.eval.harness.report import write_outputs
    from dllm_decode.eval.harness.runner import check_settings, decoder_for, evaluate
    from dllm_decode.runkey import model_identity

    with usage_errors("--model"):
        decoder, tokenizer = decoder_for(spec, distributed.local_device(str(where)), torch_dtype(dtype),
                                         chat_template, trust_remote_code=trust_remote_code,
                                         runtime=runtime, tensor_parallel=tensor_parallel, capture=capture,
                                         adapter=adapters, quantize=quantize, attention=attention,
                                         kv_cache_dtype=kv_cache_dtype)
    with usage_errors("--self-decoder"):
        if attention is not None and any(s.self_decoder != "none" for s in settings):
            raise ValueError("a self-decoder calls the model without an attention back end's state; "
                             "drop --attention (or --self-decoder)")
        check_settings(decoder, settings)
    if rank == 0:
        for message in skipped:
            click.echo(message, err=True)
    with usage_errors():
        label = str(spec) + "".join(f"+lora:{folder}" for folder in adapters)   # adapters change answers
        label = label if quantize is None else f"{label} --quantize {quantize}"
        label = label if attention is None else f"{label} --attention {attention}"
        label = label if kv_cache_dtype == "auto" else f"{label} --kv-cache-dtype {kv_cache_dtype}"
        records = evaluate(decoder, label, settings, runs, out_dir, tokenizer=tokenizer,
                           batch_size=batch_size, progress=progress, identity=model_identity(str(spec)))
    if records is None:                                  # ranks > 0: rank 0 reports
        return
    if combine:
        records = combined_records(out_dir)
    models = sorted({r["model"] for r in records})
    summary = write_outputs(records, out_dir, theory=spec.kind == "ideal", skipped=skipped,
                            meta={"model": ", ".join(models) or str(spec),
                                  "command": command_line()}, plots=plots)
    if summary.get("notice"):
        click.echo(summary["notice"], err=True)
    if as_json:
        click.echo(json.dumps(summary, default=str))
        return
    for entry in summary["leaderboard"]:
        pb = ", ".join(f"PB{k} {v:.2f}" for k, v in entry["pb"].items())
        canvas = ", ".join(f">={k}%: {v:.2f}" for k, v in entry["max_tokens_per_step"].items())
        click.echo(f"{entry['label']}: answer tokens/forward {pb}; AUP {entry['aup']:.1f}; "
                   f"ParallelBench canvas tokens/step {canvas}")
    written = ["samples.jsonl", "summary.json", "report.md", *summary.get("plots", ()),
               *summary.get("order_plots", ())]
    click.echo(f"wrote {out_dir}/{', '.join(written)}")
