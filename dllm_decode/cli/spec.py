"""`dllm-decode spec`: autoregressive speculative decoding of one prompt."""

from __future__ import annotations

import json

import click

from dllm_decode.cli.options import FloatRange, RegistryHelp, key_values, registry_names
from dllm_decode.modelspec import RUNTIMES as RUNTIME_CHOICES   # torch-free; = speculative.compact.RUNTIMES


@click.command("spec")
@click.option("--target", default="ar_target", show_default=True,
              help="Causal LM: `ar_target`, `smollm2`, a directory, a .gguf or an HF cache id.")
@click.option("--draft", "draft_spec", default="ar_draft", show_default=True, cls=RegistryHelp,
              help=lambda: f"A causal LM (`ar_draft`, `smollm2`, a directory, a .gguf) or a "
                           f"drafter: {registry_names('drafter')}, as NAME[:ARG] "
                           f"(`lookup:3`, `layerskip:2`, `dllm:MODEL`, `staged:FIRST>SECOND`; "
                           f"`dllm-decode list` shows every spelling and option).")
@click.option("-d", "--draft-opt", "draft_opts", multiple=True, metavar="KEY=VALUE",
              callback=key_values, help="Override a drafter option (`dllm-decode list`), dotted "
              "for a staged draft's stages (`second.max_ngram=3`); repeatable.")
@click.option("--scheduler", default="heuristic", show_default=True, cls=RegistryHelp,
              help=lambda: f"Decides each round's draft length: an AR rule "
                           f"({registry_names('draft_length')}) or a diffusion commit rule "
                           f"({registry_names('scheduler')}); `dllm-decode list` shows their "
                           f"fields (BiLD's rollback is lossy, greedy only).")
@click.option("-o", "--scheduler-opt", "scheduler_opts", multiple=True, metavar="KEY=VALUE",
              callback=key_values, help="Override a scheduler field; repeatable.")
@click.option("--tree-branch", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Token tree: candidates per expanded node and nodes expanded per depth "
                   "(1: a chain). Only for drafts that draft trees (an error names them).")
@click.option("--tree-budget", type=click.IntRange(1, 512), default=16, show_default=True,
              help="Most tree nodes the target verifies per round (the chain first).")
@click.option("--tree-min-prob", type=FloatRange(0, 1, max_open=True), default=0.0,
              show_default=True, help="Smallest draft path probability of a node off the chain.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--max-draft", type=click.IntRange(1, 256), default=8, show_default=True,
              help="Most tokens drafted per round (k).")
@click.option("--temperature", type=FloatRange(0, 100), default=0.0, show_default=True,
              help="0: greedy verification; > 0: speculative sampling.")
@click.option("--top-k", type=click.IntRange(1), default=None)
@click.option("--top-p", type=FloatRange(0, 1, min_open=True), default=None)
@click.option("--seed", type=click.IntRange(0, 2 ** 63 - 1), default=0, show_default=True)
@click.option("--dllm-scheduler", default="threshold", show_default=True, cls=RegistryHelp,
              help=lambda: f"Unmasking scheduler of a `dllm` drafter: {registry_names('scheduler')}.")
@click.option("--dllm-opt", "dllm_opts", multiple=True, metavar="KEY=VALUE", callback=key_values,
              help="Override a field of the dLLM's unmasking scheduler; repeatable.")
@click.option("--dllm-drop", default="", help="Text whose tokens are removed from the context "
              "before the dLLM sees it (`=` for the embedded AR format).")
@click.option("--prompt", default=None, help="Prompt text; read from stdin when omitted.")
@click.option("--chat-template/--no-chat-template", default=True, show_default=True,
              help="Apply the target tokenizer's chat template when it has one.")
@click.option("--runtime", type=click.Choice(RUNTIME_CHOICES), default="hf", show_default=True,
              help="How the target runs: `hf` (transformers, the reference numerics) or "
                   "`compact` (a lean plain-torch decoder over the same Llama weights).")
@click.option("--draft-runtime", type=click.Choice(RUNTIME_CHOICES + ("auto",)), default="auto",
              show_default=True, help="How a causal-LM or layer-skip draft runs; `auto`: compact "
              "when the model is a Llama (a draft's numerics never change the output).")
@click.option("--device", default=None, help="torch device (default: cpu).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def spec_command(target: str, draft_spec: str, draft_opts: dict[str, str], scheduler: str,
                 scheduler_opts: dict[str, str], tree_branch: int, tree_budget: int,
                 tree_min_prob: float, max_new_tokens: int, max_draft: int, temperature: float,
                 top_k: int | None, top_p: float | None, seed: int, dllm_scheduler: str, dllm_opts: dict[str, str],
                 dllm_drop: str, prompt: str | None, chat_template: bool, runtime: str,
                 draft_runtime: str, device: str | None, as_json: bool) -> None:
    """Autoregressive speculative decoding: draft a chain or a token tree, let the scheduler
    pick the draft length, verify with the target in one forward (greedy: identical to the
    target's greedy output; sampling: the target's distribution). Batch size 1."""
    import torch

    from dllm_decode.cli.options import device_option, read_prompt, usage_errors
    from dllm_decode.prompts import chat_prompt
    from dllm_decode.models.causal import load_causal_lm
    from dllm_decode.registry import component, component_dict
    from dllm_decode.speculative import (DiffusionDrafter, DraftContext, Sampling, SpecConfig,
                                         TreeShape, draft_spec as read_draft,
                                         speculative_generate, with_runtime)
    from dllm_decode.speculative.drafters import tree_drafters
    from dllm_decode.speculative.schedule import draft_length_rule

    with usage_errors("--scheduler / -o"):
        rule = draft_length_rule({"name": scheduler, **scheduler_opts})
    with usage_errors():
        config = SpecConfig(scheduler=rule, max_new_tokens=max_new_tokens, max_draft=max_draft,
                            sampling=Sampling(temperature=temperature, top_k=top_k, top_p=top_p))
    tree = None
    if tree_branch > 1:
        with usage_errors("--tree-branch / --tree-budget / --tree-min-prob"):
            tree = TreeShape(tree_branch, tree_budget, tree_min_prob)
    with usage_errors("--dllm-scheduler / --dllm-opt"):
        unmasking = component("scheduler", {"name": dllm_scheduler, **dllm_opts})
    with usage_errors("--draft / --draft-opt"):
        drafting = read_draft(draft_spec, draft_opts)
    text = read_prompt(prompt)
    where = device_option(device)
    _quiet_transformers()
    with usage_errors("--target"):
        loaded = load_causal_lm(target, device=where)
    with usage_errors("--draft"):
        drafter, _ = drafting.build(DraftContext(loaded, where, draft_runtime, unmasking, dllm_drop,
                                                 tree))
    if tree is not None and (drafter is None or isinstance(drafter, DiffusionDrafter)):
        raise click.UsageError(f"--tree-branch {tree_branch}: the draft {draft_spec!r} cannot draft "
                               f"a token tree (drafts that can: {', '.join(tree_drafters())})")
    with usage_errors("--runtime"):
        target_model = with_runtime(loaded, runtime)
    with usage_errors():
        result = speculative_generate(target_model, chat_prompt(target_model.tokenizer, text, chat_template),
                                      config, drafter,
                                      generator=torch.Generator(device=where).manual_seed(seed))
    if not as_json:
        click.echo(result.text if result.text is not None else " ".join(map(str, result.tokens.tolist())))
        return
    click.echo(json.dumps({**result.to_dict(), "target": target, "draft": draft_spec,
                           "drafter": component_dict(drafting),
                           "scheduler": component_dict(rule), "runtime": runtime,
                           "draft_runtime": draft_runtime, "max_draft": max_draft,
                           "tree": None if tree is None else {"branch": tree.branch, "budget": tree.budget,
                                                              "min_prob": tree.min_prob},
                           "max_new_tokens": max_new_tokens, "temperature": temperature,
                           "top_k": top_k, "top_p": top_p, "seed": seed}))


def _quiet_transformers() -> None:
    """No weight-loading progress bars on the terminal (stdout stays one result)."""
    from transformers.utils import logging

    logging.disable_progress_bar()
