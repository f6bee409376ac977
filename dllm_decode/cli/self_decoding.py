"""`--self-decoder NAME[:KEY=VALUE,...]` and `-s KEY=VALUE`: a self-speculative decoder (the
`self_decoder` registry: the model drafts and verifies its own tokens) in place of the denoising
loop, on `dllm-decode` and `eval`; parsed and checked here, the same way at every entry point.

A self-decoder runs its own rounds over a whole batch (`SelfDecoder.decode`), not the running
batch of the serving engine, so `serve` refuses it in one line, as `decode` does for `--input`,
`--stream`, the views, capture and tensor parallelism.
"""

from __future__ import annotations

from typing import Any

import click

from dllm_decode.cli.options import RegistryHelp, key_values, registry_names

NONE = "none"
"""`--self-decoder none` (the default): the denoising loop."""

HINT = "--self-decoder / -s"


def self_decoder_options(command: Any) -> Any:
    """The two options (`dllm-decode`, `serve` and `eval` share them; `eval` repeats the first)."""
    command = click.option("-s", "--self-decoder-opt", "self_decoder_opts", multiple=True, metavar="KEY=VALUE",
                           callback=key_values,
                           help="Set a self-decoder field (`dllm-decode list`); repeatable.")(command)
    return click.option("--self-decoder", "self_decoder", default=NONE, show_default=True, cls=RegistryHelp,
                        metavar="NAME[:KEY=VALUE,...]",
                        help=lambda: f"Self-speculative decoding: the model drafts with the scheduler's "
                                     f"rule and verifies its own drafts ({registry_names('self_decoder')}; "
                                     f"`none`: the denoising loop). Block-diffusion models; greedy, no "
                                     f"cache or filters; fields inline or with -s.")(command)


def self_decoder_eval_options(command: Any) -> Any:
    """`eval`'s form: `--self-decoder` repeatable, each one (`none` too) a curve per scheduler."""
    command = click.option("-s", "--self-decoder-opt", "self_decoder_opts", multiple=True, metavar="KEY=VALUE",
                           callback=key_values,
                           help="Set a field on every self-decoder that has it; repeatable.")(command)
    return click.option("--self-decoder", "self_decoder_specs", multiple=True, default=(NONE,), show_default=True,
                        metavar="NAME[:KEY=VALUE,...]", cls=RegistryHelp,
                        help=lambda: f"Decode every setting with a self-speculative decoder "
                                     f"({registry_names('self_decoder')}), or `none` (the denoising loop); "
                                     f"repeatable, each one its own curves.")(command)


def build_self_decoder(text: str, options: dict[str, str] | None = None) -> Any:
    """The decoder `--self-decoder TEXT -s ...` names (a `SelfDecoder`), or None for `none`.

    Raises:
        click.BadParameter: an unknown name or field, a value out of range, options without a decoder.
    """
    from dllm_decode.cli.options import parse_spec, usage_errors
    from dllm_decode.registry import component

    with usage_errors(HINT):
        name, inline = parse_spec(text)
        if name == NONE:
            if inline or options:
                raise ValueError(f"self-decoder options {sorted({**inline, **(options or {})})} need a "
                                 f"self-decoder ({registry_names('self_decoder')}); got `none`")
            return None
        return component("self_decoder", {"name": name, **inline, **(options or {})})


def preset_self_decoder(preset: Any, given: Any) -> Any:
    """The self-decoder to decode with: a tuned `--preset`'s own (its `self_decoder` part) or the
    one given; a preset's and another given one together are a usage error."""
    from dllm_decode.cli.options import usage_errors

    if preset is None or isinstance(preset, str):
        return given
    with usage_errors("--preset"):
        own = preset.build_self_decoder()
    if own is not None and given is not None and own != given:
        raise click.UsageError("--preset decodes with its own self-decoder; drop --self-decoder (or --preset)")
    return own if own is not None else given


def check_self_decoder(decoder: Any, model: Any, config: Any) -> None:
    """The decoder's own check of this model and record (`SelfDecoder.check`), as a usage error."""
    from dllm_decode.cli.options import usage_errors

    with usage_errors("--self-decoder"):
        decoder.check(model, config)


def refuse_with(decoder: Any, flags: dict[str, bool]) -> None:
    """A usage error naming the first of `flags` (flag -> given) a self-decoder cannot run with."""
    if decoder is None:
        return
    for flag, given in flags.items():
        if given:
            raise click.UsageError(f"--self-decoder decodes whole prompts in its own rounds, not the "
                                   f"denoising loop's running batch; drop {flag} (or --self-decoder)")


def refuse_serving(decoder: Any) -> None:
    """`serve --self-decoder NAME`: a usage error (the engine steps a running batch one denoising
    step at a time; a self-decoder's rounds are not such a step)."""
    if decoder is not None:
        raise click.UsageError("serve steps one running batch with the denoising loop, which cannot "
                               "drive a self-decoder's draft-and-verify rounds; use --self-decoder with "
                               "`dllm-decode --prompt` or `eval` (or drop it)")
