"""`dllm-decode bench`: speed and quality side by side, as ratios measured in one run.

One subcommand per benchmark (the logic is in `dllm_decode.eval.bench`), the options they share
defined once (`bench_options`). Every timing goes through one interleaved-repeats helper
(`dllm_decode.eval.bench.timing`); reports give figures and ratios, never pass/fail verdicts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from dllm_decode.cli.options import FloatRange, writable_file

MODEL_HELP = ("The masked diffusion LM: `embedded` (a random-weight stand-in of its size when it is "
              "not installed), `tiny` (random, speed only) or a model directory.")


def _json_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Checked while parsing, so a bad path fails before any work."""
    if value is not None:
        writable_file(value, "--json")
    return value


def bench_options(gen_lengths: bool = False, model_help: str = MODEL_HELP,
                  gen_help: str = "Canvas length", model_default: str = "embedded") -> Callable[[Any], Any]:
    """The options every benchmark takes; `gen_lengths` makes `--gen-length` repeatable (a list
    of lengths). Counts left out take the subcommand's defaults (its help lists them)."""
    def apply(command: Any) -> Any:
        options = [
            click.option("--model", "model_name", default=model_default, show_default=True, help=model_help),
            click.option("--threads", type=click.IntRange(1), default=1, show_default=True,
                         help="torch intra-op threads (1: stable on a shared machine)."),
            click.option("--repeats", type=click.IntRange(1), default=None,
                         help="Interleaved repeats; figures are their medians."),
            click.option("--per-task", type=click.IntRange(1), default=None, help="Test prompts per task."),
            click.option("--gen-length", "gen_length", type=click.IntRange(1), multiple=gen_lengths,
                         default=None, help=gen_help + ("; repeatable." if gen_lengths else ".")),
            click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
                         callback=_json_path, help="Also write the full report here (checked first)."),
            click.option("--quick", is_flag=True, help="A seconds-long configuration (smoke test)."),
        ]
        for option in reversed(options):
            command = option(command)
        return command
    return apply


def best_option(command: Any) -> Any:
    return click.option("--best", default=None, metavar="ROW",
                        help="Build on this scheduler-table row (a scheduler name or preset:NAME) "
                             "instead of running the scheduler table to pick it.")(command)


@click.group("bench", context_settings={"help_option_names": ["-h", "--help"]})
def bench_command() -> None:
    """Benchmark speed and quality side by side: ratios of medians over interleaved repeats,
    measured in one run. `all` is the suite (schedulers, stack, loop, gap, ar)."""


def _picked(**values: Any) -> dict[str, Any]:
    """The options given on the command line (None and () mean: the default)."""
    return {k: v for k, v in values.items() if v is not None and v != ()}


def _options(full: Any, quick_options: Any, quick: bool, **changes: Any) -> Any:
    import dataclasses

    from dllm_decode.cli.options import usage_errors

    with usage_errors():
        return dataclasses.replace(quick_options if quick else full, **_picked(**changes))


def _subject(model_name: str, threads: int) -> Any:
    import torch
    from transformers.utils import logging

    from dllm_decode.cli.options import usage_errors
    from dllm_decode.eval.bench.subject import load_subject

    torch.set_num_threads(threads)
    logging.disable_progress_bar()
    with usage_errors("--model"):
        return load_subject(model_name)


def _causal_named(text: str | None, hint: str, default: str | None = None) -> None:
    """A causal LM the user named explicitly must exist: a usage error before any work, not a
    suite skipped at run time (defaults keep skipping when not installed)."""
    if text is None or text == default:
        return
    from pathlib import Path

    from dllm_decode.cli.options import usage_errors
    from dllm_decode.speculative.gguf import WHEEL_MODELS
    from dllm_decode.speculative.models import resolve_causal_dir

    with usage_errors(hint):
        if text in WHEEL_MODELS:
            return
        if text.endswith(".gguf"):
            if not Path(text).expanduser().is_file():
                raise ValueError(f"GGUF file {text!r} does not exist")
            return
        resolve_causal_dir(text)


def _emit(report: dict[str, Any], text: str, json_path: str | None) -> None:
    click.echo(text)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1, default=str)


def _cache_variants(texts: tuple[str, ...], hint: str) -> tuple[tuple[str, Any], ...]:
    """`NAME[:KEY=VALUE,...]` texts -> (text, cache) pairs; a bad one is a usage error."""
    from dllm_decode.cli.options import parse_spec, usage_errors
    from dllm_decode.registry import component

    with usage_errors(hint):
        return tuple((text, component("cache", {"name": name, **opts}))
                     for text in texts for name, opts in [parse_spec(text)])


def _say(line: str) -> None:
    click.echo(line, err=True)


def _suite(sections: tuple[str, ...], model_name: str, threads: int, repeats: int | None,
           per_task: int | None, gen_length: int | None, json_path: str | None, quick: bool,
           best: str | None = None, **changes: Any) -> None:
    from dllm_decode.cli.options import usage_errors
    from dllm_decode.eval.bench.report import format_suite
    from dllm_decode.eval.bench.sections import QUICK, SuiteOptions, combo_named
    from dllm_decode.eval.bench.suite import run_suite

    options = _options(SuiteOptions(), QUICK, quick, repeats=repeats, per_task=per_task,
                       gen_length=gen_length, **changes)
    if best is not None:
        with usage_errors("--best"):
            combo_named(best, options, None)
    subject = _subject(model_name, threads)
    report = run_suite(subject, options, sections, threads, best=best, say=_say)
    _emit(report, format_suite(report), json_path)


SUITE_DEFAULTS = ("Defaults: 8 prompts per task of 7 deterministic tasks, gen 256, block 32, batch 8, "
                  "3 repeats (the scheduler table 1); --quick: 1 per task, gen 16, block 8, 1 repeat.")


@bench_command.command("all", epilog=SUITE_DEFAULTS)
@bench_options()
@best_option
def all_command(**shared: Any) -> None:
    """The suite: schedulers, stack, loop, oracle gap and AR (what `dllm-decode bench` ran)."""
    from dllm_decode.eval.bench.suite import ALL

    _suite(ALL, **shared)


@bench_command.command("schedulers", epilog=SUITE_DEFAULTS)
@bench_options()
def schedulers_command(**shared: Any) -> None:
    """Every scheduler at its paper defaults and the tuned presets, no cache: NFE, accuracy and
    speed against one token per step and the Learn2PD oracle."""
    _suite(("schedulers",), **shared)


@bench_command.command("stack", epilog=SUITE_DEFAULTS)
@bench_options()
@best_option
def stack_command(**shared: Any) -> None:
    """Prefix and dual caches and the EoTP filter on `threshold` and the best scheduler; the full
    stack against one token per step without cache."""
    _suite(("stack",), **shared)


@bench_command.command("loop", epilog=SUITE_DEFAULTS + " Batch sizes 1, 4, 16 (--quick: 1, 2).")
@bench_options()
@best_option
def loop_command(**shared: Any) -> None:
    """Loop overhead (share of time outside model forwards) and tokens per second by batch size,
    for one token per step and for the full stack."""
    _suite(("loop",), **shared)


@bench_command.command("gap", epilog=SUITE_DEFAULTS)
@bench_options()
def gap_command(**shared: Any) -> None:
    """Oracle gap: how many steps answer tokens stay correct before one token per step commits
    them, and the confidences a threshold rule would have needed."""
    _suite(("gap",), **shared)


@bench_command.command("ar", epilog="Defaults: the suite's first 14 prompts, 32 new tokens, 3 repeats; "
                                    "--quick: 2 prompts, 8 new tokens, 1 repeat.")
@bench_options(gen_help="New tokens per prompt")
def ar_command(gen_length: int | None, **shared: Any) -> None:
    """Plain greedy AR against AR + speculative decoding with the shipped draft (embedded pair,
    batch 1; greedy verification, so the outputs must be identical)."""
    _suite(("ar",), gen_length=None, ar_new_tokens=gen_length, **shared)


@bench_command.command("compile", epilog="Defaults: gen 256, block 32, 9 timed forwards each "
                                         "(--quick: gen 16, block 8, 5).")
@bench_options()
def compile_command(**shared: Any) -> None:
    """One forward, eager against `torch.compile` (static shapes), for a full and a dual-cache
    step at batch 1, and the compile time (minutes on CPU)."""
    _suite(("compile",), **shared)


@bench_command.command("runtime", epilog="Defaults: gen 256, block 32, batch 1, 15 interleaved "
                                          "repeats; --quick: gen 32, block 8, 3 repeats.")
@bench_options()
@click.option("--block-length", type=click.IntRange(1), default=32, show_default=True,
              help="Rows of the cached step.")
@click.option("--batch-size", "batch_sizes", type=click.IntRange(1), multiple=True,
              help="Prompts per forward; repeatable [1].")
@click.option("--profile", is_flag=True, help="Also print the torch profiler's top ops of each "
                                              "compact forward.")
@click.option("--device", default=None, help="cpu, cuda, cuda:N [cpu].")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None,
              help="Weights and activations [the model's own].")
def runtime_command(model_name: str, threads: int, repeats: int | None, per_task: int | None,
                    gen_length: int | None, json_path: str | None, quick: bool, block_length: int,
                    batch_sizes: tuple[int, ...], profile: bool, device: str | None,
                    dtype: str | None) -> None:
    """One forward, the reference blocks against the compact runtime (fused projections, rotary
    lookup): a full forward and a cached block step, ratios of interleaved medians, and how far
    the logits differ."""
    from dllm_decode.cli.options import device_option
    from dllm_decode.devices import DTYPES, device_name
    from dllm_decode.eval.bench.forward import runtime_speedup, runtime_table
    from dllm_decode.eval.bench.subject import samples_for

    chosen = device_option(device) if device is not None else None
    subject = _subject(model_name, threads)
    if chosen is not None or dtype is not None:
        subject.model.to(device=chosen, dtype=DTYPES[dtype] if dtype else None)
    gen = gen_length or (32 if quick else 256)
    block = min(block_length, 8) if quick else block_length
    count = repeats or (3 if quick else 15)
    batches = batch_sizes or (1,)
    prompts = [s.prompt for s in samples_for(subject, per_task or 1, tasks=None)][:max(batches)]
    rows = runtime_speedup(subject.model, prompts, subject.tokenizer, gen, block, count, batches)
    weights = next(subject.model.parameters())
    header = (f"compact runtime vs reference ({model_name}, {str(weights.dtype)[6:]} on "
              f"{device_name(weights.device)}, {threads} thread(s), gen {gen}, block {block}, "
              f"{count} interleaved repeats; median ms per forward)")
    lines = runtime_table(rows, header)
    if profile:
        from dllm_decode.eval.bench.forward import profile_runtime

        lines += profile_runtime(subject.model, prompts[:1], subject.tokenizer, gen, block)
    _emit({"runtime": rows, "gen_length": gen, "block_length": block, "repeats": count,
           "threads": threads, "device": device_name(weights.device), "dtype": str(weights.dtype)},
          "\n".join(lines), json_path)


@bench_command.command("cache", epilog="Defaults: 4 prompts per task of every task (48), gen 256 and "
                                       "512, batch 1, 4 and 16, 3 repeats, threshold 0.9, block 32; "
                                       "--quick: 1 per task, gen 64, batch 1 and 4, 1 repeat.")
@bench_options(gen_lengths=True)
@click.option("--batch", "batch_sizes", type=click.IntRange(1), multiple=True,
              help="A batch size; repeatable.")
@click.option("--threshold", type=FloatRange(0, 1, min_open=True), default=None,
              help="Of the threshold scheduler (1.0: about one token per step, a long decode).")
@click.option("--stop-at-eos/--no-stop-at-eos", default=None,
              help="Stop a row after the block holding its end-of-text [stop].")
@click.option("--variant", "variants", multiple=True, metavar="NAME[:KEY=VALUE,...]",
              help="Also compare this configured cache (e.g. dual:prefix_look=1024); repeatable.")
@click.option("--new-caches/--no-new-caches", default=None,
              help="Also compare d2, elastic, suffix and suffix:mode=dpad at their defaults [on].")
def cache_command(model_name: str, threads: int, repeats: int | None, per_task: int | None,
                  gen_length: tuple[int, ...], json_path: str | None, quick: bool,
                  batch_sizes: tuple[int, ...], threshold: float | None, stop_at_eos: bool | None,
                  variants: tuple[str, ...], new_caches: bool | None) -> None:
    """The caches (none, prefix, dual, d2, elastic, suffix, dpad, variants) over many prompts and
    batch sizes: seconds per sample, answer and canvas tokens per second, NFE, speedup over none
    and over dual (vs_dual), agreement
    with none and accuracy; one forward's cost at the first block beside each cell."""
    from dllm_decode.eval.bench.cache import CACHE_QUICK, CacheOptions, run_cache
    from dllm_decode.eval.bench.report import format_cache
    from dllm_decode.eval.bench.subject import machine

    caches = _cache_variants(variants, "--variant")
    options = _options(CacheOptions(), CACHE_QUICK, quick, repeats=repeats, per_task=per_task,
                       gen_lengths=gen_length, batch_sizes=batch_sizes, threshold=threshold,
                       stop_at_eos=stop_at_eos, variants=caches, new_caches=new_caches)
    subject = _subject(model_name, threads)
    report = {"machine": machine(threads), **run_cache(subject, options, _say)}
    _emit(report, format_cache(report), json_path)


@bench_command.command("scaling", epilog="Defaults: gen 64, 128, 256, ... up to the context, 1 prompt "
                                         "per task of every task, batch 8, block 32, 3 repeats; "
                                         "--quick: gen 16, 32, 64, block 16, batch 4, 1 repeat.")
@bench_options(gen_lengths=True)
@click.option("--batch", type=click.IntRange(1), default=None, help="Prompts per decode call.")
@click.option("--cache", "caches", multiple=True, metavar="NAME[:KEY=VALUE,...]",
              help="Also time the default decode under this cache (e.g. suffix); repeatable.")
def scaling_command(model_name: str, threads: int, repeats: int | None, per_task: int | None,
                    gen_length: tuple[int, ...], json_path: str | None, quick: bool,
                    batch: int | None, caches: tuple[str, ...]) -> None:
    """Time per sample against gen length, for the default decode (threshold, no cache), one
    token per step and the default decode under each --cache, with the fitted exponent (log-log
    least squares)."""
    from dllm_decode.cli.options import usage_errors
    from dllm_decode.eval.bench.report import format_scaling
    from dllm_decode.eval.bench.scaling import SCALING_QUICK, ScalingOptions, lengths_for, run_scaling
    from dllm_decode.eval.bench.subject import machine

    options = _options(ScalingOptions(), SCALING_QUICK, quick, repeats=repeats, per_task=per_task,
                       gen_lengths=gen_length, batch=batch, caches=_cache_variants(caches, "--cache"))
    subject = _subject(model_name, threads)
    with usage_errors("--gen-length"):
        lengths_for(subject, options)
    report = {"machine": machine(threads), **run_scaling(subject, options, _say)}
    _emit(report, format_scaling(report), json_path)


@bench_command.command("spec", epilog="Defaults: 2 prompts per task of every task, 48 new tokens, 3 "
                                      "repeats, both target runtimes, SmolLM2 when fetched (1 repeat); "
                                      "--quick: 1 per task, 8 new tokens, 1 repeat, compact target, "
                                      "no SmolLM2.")
@bench_options(model_help="The diffusion model that drafts blocks (skipped when missing or its "
                          "vocabulary differs from the target's).", gen_help="New tokens per prompt")
@click.option("--target", default=None, help="The embedded suite's target [ar_target].")
@click.option("--draft", default=None, help="The embedded suite's draft model [ar_draft].")
@click.option("--target-runtime", "target_runtimes", type=click.Choice(["hf", "compact"]), multiple=True,
              help="Run the embedded suite with the target in this runtime; repeatable [both].")
@click.option("--smollm2/--no-smollm2", default=None,
              help="Also run the SmolLM2 suite (needs `dllm-decode fetch smollm2`) [on].")
@click.option("--smollm2-repeats", type=click.IntRange(1), default=None)
@click.option("--smollm2-tokens", type=click.IntRange(1), default=None)
def spec_command(model_name: str, threads: int, repeats: int | None, per_task: int | None,
                 gen_length: int | None, json_path: str | None, quick: bool, target: str | None,
                 draft: str | None, target_runtimes: tuple[str, ...], smollm2: bool | None,
                 smollm2_repeats: int | None, smollm2_tokens: int | None) -> None:
    """AR speculative decoding: every drafter and draft-length scheduler against plain AR
    greedy, with the acceptance theory beside the measured speedup."""
    import torch

    from dllm_decode.cli.options import usage_errors
    from dllm_decode.eval.bench.report import format_spec
    from dllm_decode.eval.bench.spec import SPEC_QUICK, SpecOptions, run_spec
    from dllm_decode.eval.bench.subject import diffusion_spec, machine

    with usage_errors("--model"):
        diffusion_spec(model_name)
    _causal_named(target, "--target")
    _causal_named(draft, "--draft")
    options = _options(SpecOptions(), SPEC_QUICK, quick, repeats=repeats, per_task=per_task,
                       max_new_tokens=gen_length, dllm=model_name, target=target, draft=draft,
                       target_runtimes=target_runtimes, smollm2=smollm2,
                       smollm2_repeats=smollm2_repeats, smollm2_tokens=smollm2_tokens)
    torch.set_num_threads(threads)
    report = {"machine": machine(threads), **run_spec(options, _say)}
    _emit(report, format_spec(report), json_path)


@bench_command.command("bd", epilog="Defaults: 4 prompts per task of every task (48), gen 256 and 32 "
                                    "(native), threshold 0.9, 3 repeats; --quick: 1 per task, gen 32, "
                                    "1 repeat.")
@bench_options(gen_lengths=True, model_help="The block-diffusion model.", model_default="embedded-bd")
@click.option("--ar", "ar_model", default=None, help="Its AR parent, run greedy in the compact runtime [ar_target].")
@click.option("--dllm", default=None, help="The LLaDA-style dLLM compared beside them [embedded].")
@click.option("--threshold", type=FloatRange(0, 1, min_open=True), default=None,
              help="The threshold rule's confidence [0.9].")
def bd_command(model_name: str, threads: int, repeats: int | None, per_task: int | None,
               gen_length: tuple[int, ...], json_path: str | None, quick: bool,
               ar_model: str | None, dllm: str | None, threshold: float | None) -> None:
    """Block diffusion against its AR parent and the LLaDA-style dLLM, batch 1, one interleaved
    run: accuracy, forwards per answer token, seconds per sample, speedup over AR."""
    import torch

    from dllm_decode.cli.options import usage_errors
    from dllm_decode.eval.bench.blockdiff import (BD_QUICK, BlockDiffOptions, format_blockdiff,
                                                  load_models, run_blockdiff)
    from dllm_decode.eval.bench.subject import machine

    options = _options(BlockDiffOptions(), BD_QUICK, quick, repeats=repeats, per_task=per_task,
                       gen_lengths=gen_length, threshold=threshold, ar=ar_model, dllm=dllm,
                       bd=model_name)
    torch.set_num_threads(threads)
    with usage_errors("--model"):
        models = load_models(options)
    report = {"machine": machine(threads), **run_blockdiff(options, models, _say)}
    _emit(report, format_blockdiff(report), json_path)


@bench_command.command("serving", epilog="Defaults: 320 task prompts, 64 clients, max batch 32, gen 32, "
                                         "block 8, threshold 0.9.")
@click.option("--model", "model_name", default="embedded", show_default=True, help=MODEL_HELP)
@click.option("--requests", type=click.IntRange(1), default=320, show_default=True)
@click.option("--clients", type=click.IntRange(1), default=64, show_default=True, help="Concurrent clients.")
@click.option("--max-batch", type=click.IntRange(1), default=32, show_default=True, help="Engine rows.")
@click.option("--gen-length", "gen", type=click.IntRange(1), default=32, show_default=True)
@click.option("--block-length", "block", type=click.IntRange(1), default=8, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, callback=_json_path,
              help="Also write the full report here (checked first).")
def serving_command(model_name: str, requests: int, clients: int, max_batch: int, gen: int, block: int,
                    json_path: str | None) -> None:
    """Load-test `dllm-decode serve` on 127.0.0.1: the same requests from one client at a time and
    from many concurrent clients, checked against offline `generate` (lost, failed, different
    answers, requests/s, p50/p99 latency, the concurrent/sequential ratio)."""
    from dllm_decode.cli.options import usage_errors
    from dllm_decode.eval.bench.serving import format_report, run

    with usage_errors("--model"):
        from dllm_decode.eval.bench.subject import diffusion_spec

        diffusion_spec(model_name)
    if block > gen or gen % block:
        raise click.BadParameter(f"--block-length {block} must divide --gen-length {gen}",
                                 param_hint="--block-length")
    report = run(model_name, requests, clients, max_batch, gen, block, progress=_say)
    _emit(report, format_report(report), json_path)


@bench_command.command("tree", epilog="Defaults: 4 AR prompts per task of every task, 48 new tokens, 3 "
                                      "repeats, both target runtimes; tree 4/16 with path floor 0.05; "
                                      "BiLD fallback 0.6, rollbacks none,1,2,3,5; dLLM self-speculation "
                                      "on 2 prompts per task, 2 repeats, K=8.")
@click.option("--target", default="ar_target", show_default=True)
@click.option("--draft", default="ar_draft", show_default=True)
@click.option("--dllm", default="embedded", show_default=True, help="The dLLM of the self-speculation part.")
@click.option("--per-task", type=click.IntRange(1), default=4, show_default=True, help="AR prompts per task.")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(1), default=48, show_default=True)
@click.option("--target-runtime", "runtimes", type=click.Choice(["hf", "compact"]), multiple=True,
              help="Target runtime; repeatable [both].")
@click.option("--tree-branch", type=click.IntRange(1, 16), default=4, show_default=True)
@click.option("--tree-budget", type=click.IntRange(1), default=16, show_default=True)
@click.option("--tree-min-prob", type=FloatRange(0, 1), default=0.05, show_default=True)
@click.option("--bild-fallback", type=FloatRange(0, 1), default=0.6, show_default=True)
@click.option("--bild-rollbacks", default="none,1,2,3,5", show_default=True,
              help="Comma list of alpha_rb in nats, `none` = exact.")
@click.option("--self-per-task", type=click.IntRange(0), default=2, show_default=True,
              help="dLLM prompts per task (0: skip the self-speculation part).")
@click.option("--self-repeats", type=click.IntRange(1), default=2, show_default=True)
@click.option("--draft-steps", type=click.IntRange(1), default=8, show_default=True)
@click.option("--self-branch", type=click.IntRange(1), default=2, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, callback=_json_path,
              help="Also write the full report here (checked first).")
def tree_command(target: str, draft: str, dllm: str, per_task: int, repeats: int, max_new_tokens: int,
                 runtimes: tuple[str, ...], tree_branch: int, tree_budget: int, tree_min_prob: float,
                 bild_fallback: float, bild_rollbacks: str, self_per_task: int, self_repeats: int,
                 draft_steps: int, self_branch: int, threads: int, json_path: str | None) -> None:
    """Chains against token trees, staged drafts, BiLD (fallback, rollback) and dLLM
    self-speculation, each against its own baseline in one interleaved run: tokens per target
    call, wall and CPU-time speedups, identical-output rate, accuracy."""
    from transformers.utils import logging as hf_logging

    from dllm_decode.cli.options import usage_errors
    from dllm_decode.eval.bench.spec_tree import parse_rollbacks, run
    from dllm_decode.speculative import TreeShape

    _causal_named(target, "--target", "ar_target")
    _causal_named(draft, "--draft", "ar_draft")
    with usage_errors("--dllm"):
        from dllm_decode.eval.bench.subject import diffusion_spec

        diffusion_spec(dllm)
    with usage_errors("--bild-rollbacks"):
        rollbacks = parse_rollbacks(bild_rollbacks)
    with usage_errors("--tree-budget"):
        shape = TreeShape(tree_branch, tree_budget, tree_min_prob)
    hf_logging.disable_progress_bar()
    report = run(target=target, draft=draft, dllm=dllm, per_task=per_task, repeats=repeats,
                 max_new_tokens=max_new_tokens, runtimes=runtimes or ("hf", "compact"), tree=shape,
                 bild_fallback=bild_fallback, bild_rollbacks=rollbacks, self_per_task=self_per_task,
                 self_repeats=self_repeats, draft_steps=draft_steps, self_branch=self_branch,
                 threads=threads, log=lambda line: click.echo(line))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1, default=str)


@bench_command.command("shaped", epilog="Defaults: LLaDA-8B's shape, bfloat16, batch 1, 8, 32, 64, "
                                        "prompts of 64 tokens, gen 256, block 32, 2 steps per block, "
                                        "none / prefix / dual, 2 repeats; --quick: the embedded shape, "
                                        "batch 1, 2, gen 32, 1 repeat.")
@click.option("--shape", type=click.Choice(["llada-8b", "embedded"]), default=None,
              help="The architecture, with random weights [llada-8b].")
@click.option("--layers", type=click.IntRange(1), default=None, help="Fewer layers than the shape's.")
@click.option("--device", default=None, help="cpu, cuda, cuda:N [cpu].")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None,
              help="Weights and activations [bfloat16].")
@click.option("--batch", "batch_sizes", type=click.IntRange(1), multiple=True, help="Batch sizes; repeatable.")
@click.option("--gen-length", type=click.IntRange(1), default=None)
@click.option("--block-length", type=click.IntRange(1), default=None)
@click.option("--steps-per-block", type=click.IntRange(1), default=None,
              help="Forwards per block (a fixed count: random weights never pass a threshold).")
@click.option("--cache", "caches", type=click.Choice(["none", "prefix", "dual"]), multiple=True,
              help="Caches to compare; repeatable [none, prefix, dual].")
@click.option("--runtime", "runtimes", type=click.Choice(["reference", "compact"]), multiple=True,
              help="Runtimes to compare on the same weights; repeatable [reference].")
@click.option("--repeats", type=click.IntRange(1), default=None, help="Interleaved repeats.")
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, callback=_json_path,
              help="Also write the full report here (checked first).")
@click.option("--quick", is_flag=True, help="A seconds-long configuration (smoke test).")
def shaped_command(shape: str | None, layers: int | None, device: str | None, dtype: str | None,
                   batch_sizes: tuple[int, ...], gen_length: int | None, block_length: int | None,
                   steps_per_block: int | None, caches: tuple[str, ...], runtimes: tuple[str, ...],
                   repeats: int | None, threads: int, json_path: str | None, quick: bool) -> None:
    """The GPU path: a LLaDA-8B-shaped model with random weights built on --device; tokens/s,
    loop overhead and cache speed-ups at each batch size, one interleaved run."""
    import torch

    from dllm_decode.cli.options import device_option
    from dllm_decode.eval.bench.shaped import SHAPED_QUICK, ShapedOptions, format_shaped, run_shaped

    chosen = device_option(device)
    options = _options(ShapedOptions(), ShapedOptions(**SHAPED_QUICK), quick, shape=shape, layers=layers,
                       device=str(chosen) if device is not None else None, dtype=dtype,
                       batch_sizes=batch_sizes, gen_length=gen_length, block_length=block_length,
                       steps_per_block=steps_per_block, caches=caches, runtimes=runtimes,
                       repeats=repeats)
    torch.set_num_threads(threads)
    report = run_shaped(options, _say)
    _emit(report, format_shaped(report), json_path)
