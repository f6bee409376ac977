"""`dllm-decode`: decode a prompt (the group's own options), `list` the registries, and the
subcommands other modules add. The only core file that imports plugin packages: names become
objects here.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
import sys
from typing import Any

import click
import torch

from dllm_decode.caches import CACHES
from dllm_decode.config import DecodeConfig, component_dict
from dllm_decode.models.loading import ModelLoadError
from dllm_decode.registry import build, describe
from dllm_decode.sampler import generate
from dllm_decode.filters import FILTERS
from dllm_decode.schedulers import SCHEDULERS, with_delimiters

DEFAULT_MODEL = "embedded"


def parse_key_values(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """`-o key=value` (repeatable) -> dict; a missing `=` is a usage error."""
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", ctx=ctx, param=param)
        out[key.strip()] = value.strip()
    return out


def parse_filter_spec(text: str) -> tuple[str, dict[str, str]]:
    """`NAME[:key=value,key=value]` -> (name, options)."""
    name, _, rest = text.partition(":")
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"filter option {item!r} must be key=value")
        options[key.strip()] = value.strip()
    return name.strip(), options


def build_or_usage_error(registry: dict, name: str, options: dict, hint: str) -> Any:
    try:
        return build(registry, name, options)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint=hint) from None


def parse_filters(specs: tuple[str, ...]) -> list[tuple[str, dict[str, str], Any]]:
    """`--filter` values -> (name, options, built filter) each; bad ones are usage errors."""
    out = []
    for spec in specs:
        try:
            name, options = parse_filter_spec(spec)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--filter") from None
        out.append((name, options, build_or_usage_error(FILTERS, name, options, "--filter")))
    return out


def load_any_model(name: str, device: str | None = None, dtype: str | None = None,
                   gen_length: int = 128):
    """A model name/path -> DiffusionLM; usage errors as `click.BadParameter`.

    `ideal` is the analytic task model, built for a canvas of `gen_length`.
    """
    if name == "tiny":
        from dllm_decode.testing import tiny_llada_with_tokenizer

        return tiny_llada_with_tokenizer()
    if name == "ideal":
        from dllm_decode.eval.theory.ideal import IdealModel
        from dllm_decode.eval.tasks.tokenizer import load_tokenizer

        model = IdealModel(gen_length)
        model.tokenizer = load_tokenizer()
        return model
    from dllm_decode.models.loading import load_model

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                   None: None}[dtype]
    try:
        return load_model(name, dtype=torch_dtype, device=device)
    except ModelLoadError as err:
        raise click.BadParameter(str(err), param_hint="--model") from None


def encode_prompt(model: Any, prompt: str, chat_template: bool) -> str | list[int]:
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None and chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             add_generation_prompt=True, tokenize=False)
    return prompt


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True,
              help="Checkpoint directory, HF repo id in the local cache, `embedded`, `ideal` or `tiny`.")
@click.option("--scheduler", type=click.Choice(sorted(SCHEDULERS)), default="threshold", show_default=True)
@click.option("-o", "--scheduler-opt", "scheduler_opts", multiple=True, metavar="KEY=VALUE",
              callback=parse_key_values, help="Override a scheduler field; repeatable.")
@click.option("--cache", "cache_name", type=click.Choice(sorted(CACHES)), default="none", show_default=True)
@click.option("-c", "--cache-opt", "cache_opts", multiple=True, metavar="KEY=VALUE",
              callback=parse_key_values, help="Override a cache field (refresh policy); repeatable.")
@click.option("--filter", "filter_specs", multiple=True, metavar="NAME[:KEY=VALUE,...]",
              help=f"Add a filter; repeatable. Choices: {', '.join(sorted(FILTERS)) or 'none yet'}.")
@click.option("--gen-length", type=int, default=128, show_default=True)
@click.option("--block-length", type=int, default=32, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--prompt", default=None, help="Prompt text; read from stdin when omitted.")
@click.option("--chat-template/--no-chat-template", default=True, show_default=True,
              help="Apply the tokenizer's chat template when it has one.")
@click.option("--device", default=None, help="torch device (default: cpu).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def main(ctx: click.Context, model_name: str, scheduler: str, scheduler_opts: dict[str, str],
         cache_name: str, cache_opts: dict[str, str], filter_specs: tuple[str, ...], gen_length: int,
         block_length: int, temperature: float, seed: int, prompt: str | None, chat_template: bool,
         device: str | None, dtype: str | None, as_json: bool) -> None:
    """Decode a prompt with a masked diffusion LM; subcommands below."""
    if ctx.invoked_subcommand is not None:
        return
    scheduler_obj = build_or_usage_error(SCHEDULERS, scheduler, scheduler_opts, "--scheduler-opt")
    cache_obj = build_or_usage_error(CACHES, cache_name, cache_opts, "--cache-opt")
    filters = [built for _, _, built in parse_filters(filter_specs)]
    try:
        config = DecodeConfig(scheduler=scheduler_obj, gen_length=gen_length,
                              block_length=block_length, temperature=temperature, seed=seed)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    if prompt is None:
        prompt = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    if not prompt.strip():
        raise click.BadParameter("the prompt is empty", param_hint="--prompt")
    model = load_any_model(model_name, device, dtype, gen_length)
    # AdaBlock's delimiters are tokenizer ids: fill an empty `delimiter_ids` from this model's.
    config = dataclasses.replace(
        config, scheduler=with_delimiters(config.scheduler, getattr(model, "tokenizer", None)))
    generator = torch.Generator(device=device or "cpu").manual_seed(seed)
    try:
        result = generate(model, [encode_prompt(model, prompt, chat_template)], config,
                          cache=cache_obj, filters=filters, generator=generator)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    text = result.text[0] if result.text is not None else " ".join(map(str, result.tokens[0].tolist()))
    if not as_json:
        click.echo(text)
        return
    names = {cls: key for registry in (SCHEDULERS, CACHES, FILTERS) for key, cls in registry.items()}
    click.echo(json.dumps({
        "text": text, "tokens": result.tokens[0].tolist(), "nfe": int(result.nfe[0]),
        "tokens_per_step": float(result.tokens_per_step[0]),
        "answer_tokens_per_step": float(result.answer_tokens_per_step[0]),
        "seconds": result.seconds, "model": model_name,
        "scheduler": component_dict(config.scheduler, names), "cache": component_dict(cache_obj, names),
        "filters": [component_dict(f, names) for f in filters],
        "config": {k: v for k, v in config.to_dict(names).items() if k != "scheduler"},
    }))


@main.command("list")
def list_registries() -> None:
    """Print every registry with each entry's hyper-parameters and defaults."""
    for title, registry in (("schedulers", SCHEDULERS), ("caches", CACHES), ("filters", FILTERS)):
        click.echo(f"{title}:")
        for name, doc, params in describe(registry):
            click.echo(f"  {name:<16} {doc}")
            for field_name, type_name, default in params:
                click.echo(f"      {field_name} ({type_name}) = {default!r}")


# `bench` (issue 9) lives in eval (it scores the task suite); cli.py is the edge allowed to import it.
from dllm_decode.eval.bench.suite import bench_command  # noqa: E402

main.add_command(bench_command)


@main.command("train-filter")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True,
              help="The model whose own one-token-per-step outputs the filter learns.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Weights file to write (safetensors).")
@click.option("--per-task", type=click.IntRange(1), default=20, show_default=True,
              help="Train-split prompts per task (a tenth is held out for the report).")
@click.option("--gen-length", type=click.IntRange(1), default=256, show_default=True)
@click.option("--block-length", type=click.IntRange(1), default=32, show_default=True)
@click.option("--width", type=click.IntRange(1), default=32, show_default=True, help="Filter input width.")
@click.option("--epochs", type=click.IntRange(1), default=2000, show_default=True)
@click.option("--threshold", type=click.FloatRange(0, 1), default=0.96, show_default=True,
              help="Accept threshold the held-out report uses.")
@click.option("--trajectory", type=click.Choice(["baseline", "oracle", "both"]), default="baseline",
              show_default=True, help="Log steps of the reference decode, of the oracle, or both.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default=None, help="torch device (default: cpu).")
def train_filter_command(model_name: str, out: str, per_task: int, gen_length: int, block_length: int,
                         width: int, epochs: int, threshold: float, trajectory: str, seed: int,
                         device: str | None) -> None:
    """Train the Learn2PD filter (`--filter learned:weights=OUT`) on the task suite's train split."""
    from dllm_decode.eval.training.filter import task_prompts, train_filter

    model = load_any_model(model_name, device)
    try:
        _, report = train_filter(model, task_prompts(per_task, seed), gen_length=gen_length,
                                 block_length=block_length, width=width, epochs=epochs,
                                 threshold=threshold, trajectory=trajectory, seed=seed, out=out,
                                 progress=lambda line: click.echo(line, err=True))
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    click.echo(json.dumps({"model": model_name, "out": out, **report}, indent=1))


@main.command("eval")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True,
              help="As for decoding: a checkpoint directory, HF cache id, `embedded`, `ideal` or `tiny`.")
@click.option("--tasks", "selection", multiple=True, default=("all",), show_default=True,
              help="Comma list of task names, groups (all, waiting_line, puzzles) or "
                   "released:DIR[#task+task] (ParallelBench's released output/test directory); "
                   "repeatable, the selections add up.")
@click.option("--scheduler", "scheduler_specs", multiple=True, default=("threshold",), show_default=True,
              metavar="NAME[:KEY=VALUE,...]", help="Repeatable; each one is a curve (or a point).")
@click.option("-o", "--scheduler-opt", "scheduler_opts", multiple=True, metavar="KEY=VALUE",
              callback=parse_key_values, help="Set a field on every scheduler that has it; repeatable.")
@click.option("--sweep", "sweep_specs", multiple=True, metavar="KEY=V1,V2,...",
              help="Sweep a scheduler field, tokens_per_step, block_length, gen_length, temperature "
                   "or cache.FIELD; repeatable (product).")
@click.option("--cache", "cache_name", type=click.Choice(sorted(CACHES)), default="none", show_default=True)
@click.option("-c", "--cache-opt", "cache_opts", multiple=True, metavar="KEY=VALUE", callback=parse_key_values)
@click.option("--filter", "filter_specs", multiple=True, metavar="NAME[:KEY=VALUE,...]")
@click.option("--limit", type=click.IntRange(1), default=None, help="Examples per task [100 / whole file].")
@click.option("--gen-length", default="32", show_default=True,
              help="Canvas length, or `answer` for each example's reference length (infilling).")
@click.option("--block-length", type=click.IntRange(1), default=None, help="Semi-AR block [whole canvas].")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Decoding seed.")
@click.option("--data-seed", type=int, default=0, show_default=True, help="Seed of the built-in tasks.")
@click.option("--sort-by", type=click.Choice(["first", "last"]), default="first", show_default=True,
              help="Released Sort labels: by first name (as released) or last name (as the prompt asks).")
@click.option("--batch-size", type=click.IntRange(1), default=8, show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Results directory; re-running the same command resumes there.")
@click.option("--chat-template/--no-chat-template", default=True, show_default=True)
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr [when a terminal].")
@click.option("--plots/--no-plots", default=True, show_default=True)
@click.option("--device", default=None)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None)
@click.option("--ar-runtime", type=click.Choice(["hf", "compact"]), default="hf", show_default=True,
              help="How an `ar:` model's target runs (its draft runs compact when it can); a compact "
                   "run is recorded as `ar:...@compact`.")
@click.option("--combine", is_flag=True,
              help="Summarize every run recorded in --out (e.g. a dLLM run and an `ar:` run of the "
                   "same tasks), not only this command's; labels then name their model.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def eval_command(model_name: str, selection: tuple[str, ...], scheduler_specs: tuple[str, ...],
                 scheduler_opts: dict[str, str], sweep_specs: tuple[str, ...], cache_name: str,
                 cache_opts: dict[str, str], filter_specs: tuple[str, ...], limit: int | None,
                 gen_length: str, block_length: int | None, temperature: float, seed: int,
                 data_seed: int, sort_by: str, batch_size: int, out_dir: str, chat_template: bool,
                 progress: bool | None, plots: bool, device: str | None, dtype: str | None,
                 ar_runtime: str, combine: bool, as_json: bool) -> None:
    """Evaluate schedulers on ParallelBench-style tasks: samples.jsonl, summary.json, report.md, plots.

    Runs data-parallel under torchrun (samples sharded by rank, merged by rank 0).
    """
    from dllm_decode.eval.harness import distributed
    from dllm_decode.eval.harness.grid import ANSWER, expand_grid, parse_sweep
    from dllm_decode.eval.harness.report import write_outputs
    from dllm_decode.eval.harness.runner import ar_decoder, diffusion_decoder, evaluate, ideal_decoder
    from dllm_decode.eval.tasks.sources import select_tasks
    from dllm_decode.eval.tasks.tokenizer import load_tokenizer

    build_or_usage_error(CACHES, cache_name, cache_opts, "--cache-opt")
    filters = [(name, tuple(sorted(options.items()))) for name, options, _ in parse_filters(filter_specs)]
    if gen_length != ANSWER and not (gen_length.isdigit() and int(gen_length) >= 1):
        raise click.BadParameter(f"expected an integer >= 1 or {ANSWER!r}, got {gen_length!r}",
                                 param_hint="--gen-length")
    try:
        specs = [parse_filter_spec(spec) for spec in scheduler_specs]
        sweeps = [parse_sweep(spec) for spec in sweep_specs]
        settings = expand_grid(specs, scheduler_opts, sweeps, cache=cache_name,
                               cache_options=tuple(sorted(cache_opts.items())), filters=tuple(filters),
                               gen_length=None if gen_length == ANSWER else int(gen_length),
                               block_length=block_length, temperature=temperature, seed=seed)
        runs, skipped = select_tasks(",".join(selection), limit, data_seed, sort_by)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    if ar_runtime != "hf" and not model_name.startswith("ar:"):
        raise click.BadParameter(f"applies to `ar:` models only, not {model_name!r}", param_hint="--ar-runtime")
    rank, _ = distributed.init_from_env(device)
    ideal = model_name == "ideal" or model_name.startswith("ideal:")
    if model_name.startswith("ar:"):     # `ar:TARGET[+DRAFT]`: the AR (speculative) baseline
        from dllm_decode.speculative.command import in_runtime, make_drafter
        from dllm_decode.speculative.models import load_causal_lm

        target_name, _, draft_spec = model_name[len("ar:"):].partition("+")
        try:
            target = load_causal_lm(target_name, device=distributed.local_device(device))
        except ModelLoadError as err:
            raise click.BadParameter(str(err), param_hint="--model") from None
        drafter, _ = make_drafter(draft_spec or "none", target, build(SCHEDULERS, "low_confidence"),
                                  "", distributed.local_device(device))
        if ar_runtime == "compact":
            target = in_runtime(target, ar_runtime, "--ar-runtime")
            model_name = f"{model_name}@compact"         # its timings are another model's
        decoder, tokenizer = ar_decoder(target, drafter, chat_template=chat_template), target.tokenizer
    elif ideal:                      # `ideal[:noise=X]`: the analytic model, built per canvas length
        try:
            _, ideal_opts = parse_filter_spec(model_name)
            decoder = ideal_decoder(float(ideal_opts.pop("noise", 1e-3)), **ideal_opts)
        except (ValueError, TypeError) as err:
            raise click.BadParameter(f"{model_name!r}: {err}", param_hint="--model") from None
        tokenizer = load_tokenizer()
    else:
        model = load_any_model(model_name, distributed.local_device(device), dtype)
        decoder, tokenizer = diffusion_decoder(model, chat_template), getattr(model, "tokenizer", None)
    if rank == 0:
        for message in skipped:
            click.echo(message, err=True)
    try:
        records = evaluate(decoder, model_name, settings, runs, out_dir, tokenizer=tokenizer,
                           batch_size=batch_size,
                           progress=sys.stderr.isatty() if progress is None else progress)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    if records is None:                                  # ranks > 0: rank 0 reports
        return
    if combine:
        records = combined_records(out_dir)
    models = sorted({r["model"] for r in records})
    summary = write_outputs(records, out_dir, theory=ideal, skipped=skipped,
                            meta={"model": ", ".join(models) or model_name,
                                  "command": " ".join(sys.argv)}, plots=plots)
    if as_json:
        click.echo(json.dumps(summary, default=str))
        return
    for entry in summary["leaderboard"]:
        levels = ", ".join(f">={k}%: {v:.2f}" for k, v in entry["max_tokens_per_step"].items())
        click.echo(f"{entry['label']}: max tokens/step {levels}")
    click.echo(f"wrote {out_dir}/samples.jsonl, summary.json, report.md")


def combined_records(out_dir: str) -> list[dict[str, Any]]:
    """Every finished sample in `out_dir`, labels prefixed by their model when several share it."""
    from dllm_decode.eval.harness.records import read_records, unique_by_key
    from dllm_decode.eval.harness.runner import SAMPLES

    records = unique_by_key(read_records(Path(out_dir) / SAMPLES))
    if len({r["model"] for r in records}) < 2:
        return records
    return [{**r, "label": f"{r['model']} {r['label']}", "group": f"{r['model']} {r['group']}"}
            for r in records]


# AR speculative decoding (`spec`, `fetch smollm2`): its draft-length schedulers are looked up here,
# in the diffusion registry plus the AR-only ones, because core may not import `schedulers`.
from dllm_decode.speculative.command import fetch_command, spec_command  # noqa: E402

main.add_command(spec_command(SCHEDULERS))
main.add_command(fetch_command)
