"""`dllm-decode tune`: the fastest policy per task (and one overall) within a quality budget."""

from __future__ import annotations

import click

from dllm_decode.cli.decode import DEFAULT_MODEL
from dllm_decode.cli.options import DTYPES, MAX_CANVAS, MAX_PROMPTS

DEFAULT_RULES = "threshold,factor,frechet,eb,entropy_threshold,hierarchy,slowfast,klass,less,local_leap,dus,multi_block"


@click.command("tune")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True,
              help="A diffusion model (directory, `embedded`, `tiny`) or `ideal[:noise=X]`.")
@click.option("--tasks", "selection", default="all", show_default=True, help="As for `eval`.")
@click.option("--calibration", type=click.IntRange(1, MAX_PROMPTS), default=100, show_default=True,
              help="Calibration prompts per task (the search sees only these).")
@click.option("--held-out", type=click.IntRange(1, MAX_PROMPTS), default=100, show_default=True,
              help="Held-out prompts per task (only scored, never searched on).")
@click.option("--data-seed", type=click.IntRange(0, 2 ** 63 - 1), default=0, show_default=True)
@click.option("--split-salt", default="tune", show_default=True, help="Salt of the prompt hash that splits them.")
@click.option("--budget", default="within:1.0", show_default=True,
              help="within:POINTS (paired drop against one token per step) or at-least:PERCENT.")
@click.option("--confidence", type=float, default=0.8, show_default=True,
              help="One-sided level of the Wilson bound a calibration point must meet the budget with "
                   "(0.5: the point estimate). Higher: fewer held-out misses, fewer points accepted.")
@click.option("--rules", default=DEFAULT_RULES, show_default=True, help="Rules to search (comma list).")
@click.option("--caches", default="none", show_default=True,
              help="Caches to cross with (comma list, or `auto`: none, prefix, dual and es where the model takes them). Under the "
                   "forwards objective a cache changes no forward count, only accuracy.")
@click.option("--self-decoders", "self_decoders", default="auto", show_default=True,
              help="Self-speculative decoders to search too, each along its base rule's knob (comma list, "
                   "`none`, or `auto`: every one a block-diffusion model takes; none for other models).")
@click.option("--gen-length", default="256", show_default=True, help="Canvas length, or `answer`.")
@click.option("--block-length", type=click.IntRange(1, MAX_CANVAS), default=None,
              help="Block length (default: the model's own block or noise canvas, else 32; ignored "
                   "with --gen-length answer: one block per canvas).")
@click.option("--exhaustive", is_flag=True, help="Also run the full grid on the calibration split (forward count "
                                                 "and best single global setting, for comparison).")
@click.option("--batch-size", type=click.IntRange(1), default=8, show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Resumable: samples are kept under OUT/calibration and OUT/held_out.")
@click.option("--progress/--no-progress", default=None)
@click.option("--device", default=None)
@click.option("--dtype", type=click.Choice(DTYPES), default=None)
def tune_command(model_name: str, selection: str, calibration: int, held_out: int, data_seed: int, split_salt: str,
                 budget: str, confidence: float, rules: str, caches: str, self_decoders: str, gen_length: str,
                 block_length: int | None, exhaustive: bool,
                 batch_size: int, out_dir: str, progress: bool | None, device: str | None, dtype: str | None) -> None:
    """Search rules x their main knob x caches on a calibration split for the fastest setting (mean
    forwards per prompt) within the budget, per task and overall; check it on a held-out split;
    write OUT/presets.json, tune.json and report.md."""
    from pathlib import Path

    from dllm_decode.cli.options import device_option, model_spec, torch_dtype, usage_errors, writable_dir
    from dllm_decode.eval.harness import distributed
    from dllm_decode.eval.harness.runner import decoder_for
    from dllm_decode.eval.tasks.sources import select_tasks
    from dllm_decode.eval.harness.presets import identity_of
    from dllm_decode.eval.tune.output import write
    from dllm_decode.eval.tune.search import Budget
    from dllm_decode.eval.tune.space import SPACE, check_rules
    from dllm_decode.eval.tune.tuner import tune

    spec = model_spec(model_name)
    if spec.kind == "ar":
        raise click.UsageError("tune searches diffusion decoding policies; the AR baseline has none")
    if gen_length != "answer" and not (gen_length.isascii() and gen_length.isdigit() and 1 <= int(gen_length) <= MAX_CANVAS):
        raise click.BadParameter(f"expected an integer in [1, {MAX_CANVAS}] or 'answer', got {gen_length!r}",
                                 param_hint="--gen-length")
    canvas = None if gen_length == "answer" else int(gen_length)
    names = [r.strip() for r in rules.split(",") if r.strip()]
    if not names:
        raise click.BadParameter(f"no rules given; searchable rules: {', '.join(sorted(SPACE))}",
                                 param_hint="--rules")
    if not 0.5 <= confidence < 1:
        raise click.BadParameter(f"confidence must be in [0.5, 1) (0.5: the point estimate), got {confidence:g}",
                                 param_hint="--confidence")
    with usage_errors("--budget"):
        parsed = Budget.parse(budget, confidence)
    with usage_errors("--rules"):
        check_rules(names)
    if parsed.kind == "within" and parsed.least_certifiable(calibration) > parsed.points:
        need = next(n for n in range(calibration, 10 ** 7) if parsed.least_certifiable(n) <= parsed.points)
        click.echo(f"note: on {calibration} calibration prompts per task the least drop certifiable at confidence "
                   f"{confidence:g} is {parsed.least_certifiable(calibration):.2g} points, more than the budget's "
                   f"{parsed.points:g}: every task keeps the reference (no setting is certified); use "
                   f"--calibration {need} or more, a looser budget, or a lower --confidence", err=True)
    if canvas is None:                      # block lengths must divide every answer length
        skipped = [r for r in names if SPACE[r].field == "block_length"]
        names = [r for r in names if r not in skipped]
        if skipped:
            click.echo(f"skipped {', '.join(skipped)}: its knob is the block length, which needs a fixed "
                       f"--gen-length", err=True)
    with usage_errors("--tasks"):
        runs, messages = select_tasks(selection, calibration + held_out, data_seed)
    writable_dir(out_dir, "--out")
    where = device_option(device)
    rank, _ = distributed.init_from_env(str(where))       # torchrun: data-parallel, decisions on every rank
    with usage_errors("--model"):
        decoder, tokenizer = decoder_for(spec, distributed.local_device(str(where)), torch_dtype(dtype))
    model = getattr(decoder, "model", None)
    own = getattr(model, "block_size", None) or getattr(model, "canvas_length", None)
    block = None if canvas is None else block_length or own or 32
    cache_names = _caches(caches, spec, model)
    selfdecs = _self_decoders(self_decoders, decoder, canvas, block)
    for message in messages if rank == 0 else ():
        click.echo(message, err=True)
    with usage_errors():
        outcome = tune(decoder, str(spec), runs, rules=names, caches=cache_names, budget=parsed,
                       calibration=calibration, salt=split_salt, gen_length=canvas, block_length=block,
                       out=Path(out_dir), tokenizer=tokenizer, batch_size=batch_size,
                       progress=True if progress is None else progress, exhaustive=exhaustive,
                       log=(lambda line: click.echo(line, err=True)) if rank == 0 else None,
                       self_decoders=selfdecs)
    if rank != 0:                                         # rank 0 writes and reports
        return
    from dllm_decode.cli.evaluate import command_line

    write(outcome, Path(out_dir), model=identity_of(spec), command=command_line(),
          gen_length=canvas or 0)
    for task in outcome.tasks:
        point = outcome.per_task[task]
        click.echo(f"{task}: " + (f"{point.setting.label()} {point.setting.params()} NFE {point.nfe:.2f}"
                                  if point else "reference (nothing faster met the budget)")
                   + held_out_words(outcome.held_out.get(f"task:{task}" if point else "reference", {}).get(task)))
    click.echo(f"overall: {outcome.overall.label() + ' ' + str(outcome.overall.params()) if outcome.overall else 'none'}")
    click.echo(f"wrote {out_dir}/presets.json, tune.json, report.md")


def held_out_words(figures: dict[str, float] | None) -> str:
    """`; held out: 95.0% (Δ -1.2 ± 3.4), meets the budget` or `..., FAILS the budget`: what
    report.md says of a preset on the held-out prompts, on screen."""
    if not figures:
        return ""
    verdict = "meets the budget" if figures["meets"] else "FAILS the budget on the held-out prompts"
    return (f"; held out: {figures['accuracy']:.1f}% (Δ {figures['delta']:+.1f} ± {figures['delta_ci95']:.1f}), "
            f"NFE {figures['nfe']:.2f}, {verdict}")


AUTO_CACHES = ("none", "prefix", "dual", "es")
"""`--caches auto`: no cache, Fast-dLLM's two, and ES-dLLM's early skipping, each where the model
takes it."""


def _caches(text: str, spec, model=None) -> list[str]:
    from dllm_decode.caches import CACHES
    from dllm_decode.compat import cache_refusal

    if text == "auto":
        if spec.kind == "ideal":
            return ["none"]
        return [c for c in AUTO_CACHES if model is None or cache_refusal(CACHES[c](), model) is None]
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CACHES]
    if unknown or not names:
        raise click.BadParameter(f"unknown cache {', '.join(unknown) or '(none given)'}; known: {', '.join(sorted(CACHES))}",
                                 param_hint="--caches")
    if spec.kind == "ideal" and names != ["none"]:
        raise click.BadParameter("the ideal model has no K/V to cache; use --caches none", param_hint="--caches")
    return names


def _self_decoders(text: str, decoder, gen_length: int | None, block_length: int | None) -> list[str]:
    """`--self-decoders`: `auto` (those a block-diffusion model takes), `none`, or names, each
    checked against the model as `eval --self-decoder` checks it."""
    from dllm_decode.cli.options import usage_errors
    from dllm_decode.eval.harness.runner import check_settings
    from dllm_decode.eval.tune.space import SELF_BASE, self_chain, self_decoders_for

    if text == "auto":
        return self_decoders_for(decoder, gen_length, block_length)
    names = [] if text == "none" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SELF_BASE]
    if unknown or (text != "none" and not names):
        raise click.BadParameter(f"unknown self-decoder {', '.join(unknown) or '(none given)'}; known: "
                                 f"{', '.join(SELF_BASE)}, or auto / none", param_hint="--self-decoders")
    with usage_errors("--self-decoders"):
        for name in names:
            check_settings(decoder, self_chain(name, gen_length, block_length)[:1])
    return names
