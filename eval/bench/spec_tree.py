"""The rest of the speculative family side by side: chain vs token tree vs staged vs BiLD on the
embedded AR pair, and dLLM self-speculation on the embedded diffusion model.

    dllm-decode bench tree [--json FILE] [--per-task N] [--repeats R] [--quick]

AR part (all 12 tasks, `per_task` test prompts each, the `prompt =` AR format), once per target
runtime (transformers `hf`, `compact`); every configuration decodes the same prompts in a
rotated order within each repeat (`spec.measure`), so load drifts hit all alike:

* plain AR greedy (the baseline of every speed-up);
* chain: the distilled draft (compact runtime), HF's heuristic draft length (k <= 16), a
  constant k = 16 (the node budget the trees get) and the threshold rule at 0.4;
* tree: the same draft and the same schedules, `--tree-branch` / `--tree-budget` /
  `--tree-min-prob` (a tree holds the chain plus alternatives, one draft forward per depth, as
  the chain; at most as many nodes as the constant chain's k);
* staged: `staged:ar_draft>lookup` (the draft's own drafting speculated by prompt lookup), as a
  chain and with free sibling leaves;
* BiLD: fallback alpha_fb (N = 10) with exact verification and with rollback at alpha_rb nats.

Per configuration: tokens per target call, acceptance alpha, verified nodes per call, draft
forwards per token, wall-clock speed-up vs plain AR (ratio of medians), identical-output rate
vs plain greedy, task accuracy.

Self-speculation part: the embedded dLLM (gen 32, one block) decoded one token per step
(`generate`, low_confidence), by self-speculation of that same decode (`draft_steps` nested
drafts, `branch - 1` leaves per step), by threshold decoding, and by self-speculation of
threshold decoding: forwards (NFE), canvas rows computed, seconds, identical rate, accuracy.
Batch size 1, greedy, float32, CPU, 1 torch thread by default.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.models import ModelLoadError, load_model
from dllm_decode.sampler import generate
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler
from dllm_decode.speculative import (BildScheduler, HeuristicScheduler, LookupDrafter, ModelDrafter,
                                     SpecResult, StagedDrafter, TreeShape, with_runtime)
from dllm_decode.models.causal import load_causal_lm
from dllm_decode.speculative.selfspec import self_speculative_generate
from dllm_decode.eval.bench.spec import SpecCombo, measure, summarize
from dllm_decode.eval.bench.timing import check_counts, interleave, speedup

DEFAULT_ROLLBACKS = (None, 1.0, 2.0, 3.0, 5.0)


@dataclass(frozen=True)
class TreeOptions:
    """What `bench tree` runs.

    Attributes:
        target, draft: the AR pair (causal LM names); dllm: the self-speculation part's model.
        per_task, repeats, max_new_tokens, runtimes: the AR part's prompts per task, interleaved
            repeats, new tokens and target runtimes.
        tree_branch, tree_budget, tree_min_prob: the token trees' shape (`TreeShape`).
        bild_fallback, bild_rollbacks: BiLD's alpha_fb and its alpha_rb values (None: exact).
        self_per_task, self_repeats, draft_steps, self_branch: the self-speculation part (0
            prompts per task: skipped).
    Raises:
        ValueError: a count below 1 or a tree `TreeShape` refuses.
    """

    target: str = "ar_target"
    draft: str = "ar_draft"
    dllm: str = "embedded"
    per_task: int = 4
    repeats: int = 3
    max_new_tokens: int = 48
    runtimes: tuple[str, ...] = ("hf", "compact")
    tree_branch: int = 4
    tree_budget: int = 16
    tree_min_prob: float = 0.05
    bild_fallback: float = 0.6
    bild_rollbacks: tuple[float | None, ...] = DEFAULT_ROLLBACKS
    self_per_task: int = 2
    self_repeats: int = 2
    draft_steps: int = 8
    self_branch: int = 2
    threads: int = 1

    def __post_init__(self) -> None:
        check_counts(self, "per_task", "repeats", "max_new_tokens", "self_repeats", "draft_steps",
                     "self_branch", "threads")
        if self.self_per_task < 0:
            raise ValueError(f"self_per_task must be >= 0, got {self.self_per_task}")
        TreeShape(self.tree_branch, self.tree_budget, self.tree_min_prob)     # checks the shape

    @property
    def tree(self) -> TreeShape:
        return TreeShape(self.tree_branch, self.tree_budget, self.tree_min_prob)


def run(o: TreeOptions, say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Measure everything; returns a JSON-ready report (`"ar"` per runtime, `"self_speculation"`)."""
    torch.set_num_threads(o.threads)
    report: dict[str, Any] = {"threads": o.threads, "per_task": o.per_task, "repeats": o.repeats,
                              "tree": {"branch": o.tree_branch, "budget": o.tree_budget}}
    try:
        loaded, draft_hf = load_causal_lm(o.target), load_causal_lm(o.draft)
    except ModelLoadError as err:
        say(f"AR part skipped: {err}")
        loaded = None
    if loaded is not None:
        report["ar"] = {runtime: ar_suite(loaded, draft_hf, runtime, o, say)
                        for runtime in dict.fromkeys(o.runtimes)}
    if o.self_per_task > 0:
        try:
            model = load_model(o.dllm)
        except ModelLoadError as err:
            say(f"self-speculation part skipped: {err}")
        else:
            report["self_speculation"] = self_suite(model, o.self_per_task, o.self_repeats, o.draft_steps,
                                                    o.self_branch, say)
    return report


def ar_configs(draft: Any, tree: TreeShape, bild_fallback: float,
               bild_rollbacks: Sequence[float | None]) -> list[SpecCombo]:
    """The AR rows; the first is the baseline."""
    heuristic, constant = HeuristicScheduler(), LowConfidenceScheduler(steps_per_block=1)
    lookup = LookupDrafter()
    name = f"tree {tree.branch}/{tree.budget}"
    configs = [
        SpecCombo("plain AR greedy", None, constant),
        SpecCombo("chain, heuristic", ModelDrafter(draft), heuristic, 16, draft),
        SpecCombo(f"{name}, heuristic", ModelDrafter(draft, tree), heuristic, 16, draft),
        SpecCombo("chain, constant k=16", ModelDrafter(draft), constant, 16, draft),
        SpecCombo(f"{name}, constant k=16", ModelDrafter(draft, tree), constant, 16, draft),
        SpecCombo("chain, threshold 0.4", ModelDrafter(draft), ThresholdScheduler(0.4), 16, draft),
        SpecCombo(f"{name}, threshold 0.4", ModelDrafter(draft, tree), ThresholdScheduler(0.4), 16, draft),
        SpecCombo("staged >lookup, heuristic", StagedDrafter(ModelDrafter(draft), lookup), heuristic, 16, draft),
        SpecCombo(f"staged >lookup + leaves {tree.branch}/{tree.budget}, heur.",
               StagedDrafter(ModelDrafter(draft, tree), lookup), heuristic, 16, draft),
    ]
    for rollback in bild_rollbacks:
        label = "exact" if rollback is None else f"rollback {rollback:g}"
        configs.append(SpecCombo(f"BiLD fallback {bild_fallback:g}, {label}", ModelDrafter(draft),
                              BildScheduler(bild_fallback, rollback, 10), 10, draft))
    return configs


def ar_suite(loaded: Any, draft_hf: Any, runtime: str, o: TreeOptions,
             say: Callable[[str], None]) -> dict[str, Any]:
    from dllm_decode.eval.tasks import TASKS
    from dllm_decode.eval.tasks.tokenizer import SEPARATOR

    target = with_runtime(loaded, runtime)
    draft = with_runtime(draft_hf, "auto")
    tokenizer = target.tokenizer
    tree, repeats = o.tree, o.repeats
    examples = [e for name in sorted(TASKS) for e in TASKS[name].examples("test", o.per_task, 0)]
    prompts = [tokenizer(f"{e.prompt} {SEPARATOR}", add_special_tokens=False)["input_ids"]
               for e in examples]
    configs = ar_configs(draft, tree, o.bild_fallback, o.bild_rollbacks)
    say(f"AR, target runtime {runtime}: {len(prompts)} task prompts, {len(configs)} configurations, "
        f"{repeats} repeats")
    measured = measure(target, prompts, configs, repeats, o.max_new_tokens)

    def accuracy(results: list[SpecResult]) -> float:
        return statistics.fmean(TASKS[e.task].score(e, r.text or "") for e, r in zip(examples, results))

    entries = summarize(measured, accuracy)
    reference = [run.result.tokens.tolist() for run in measured[0][1].values()]
    for entry, (_, runs) in zip(entries, measured):
        results = [run.result for run in runs.values()]
        calls = sum(r.target_forwards for r in results)
        entry["nodes_per_call"] = sum(sum(r.nodes) for r in results) / calls
        entry["identical_rate"] = statistics.fmean(
            r.tokens.tolist() == ref for r, ref in zip(results, reference))
    by_label = {e["label"]: e for e in entries}
    name = f"tree {tree.branch}/{tree.budget}"
    ratios = {schedule: by_label[f"{name}, {schedule}"]["mean_accepted_tokens"]
              / by_label[f"chain, {schedule}"]["mean_accepted_tokens"]
              for schedule in ("heuristic", "constant k=16", "threshold 0.4")}
    return {"target_runtime": runtime, "prompts": len(prompts), "rows": entries,
            "tree_over_chain_tokens_per_call": ratios}


def self_suite(model: Any, per_task: int, repeats: int, draft_steps: int, branch: int,
               say: Callable[[str], None]) -> dict[str, Any]:
    """One token per step, its self-speculation, threshold decoding and its self-speculation."""
    from dllm_decode.eval.tasks import TASKS

    examples = [e for name in sorted(TASKS) for e in TASKS[name].examples("test", per_task, 0)]
    stepwise = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=32, block_length=32)
    threshold = DecodeConfig(scheduler=ThresholdScheduler(0.9), gen_length=32, block_length=32)
    plans: list[tuple[str, DecodeConfig, int | None, int]] = [
        ("one token per step", stepwise, None, 1),
        (f"self-spec of it, K={draft_steps}", stepwise, draft_steps, 1),
        (f"self-spec of it, K={draft_steps}, {branch - 1} leaf/step", stepwise, draft_steps, branch),
        ("threshold 0.9", threshold, None, 1),
        (f"self-spec of threshold 0.9, K={draft_steps}, {branch - 1} leaf/step", threshold,
         draft_steps, branch),
    ]
    say(f"dLLM self-speculation: {len(examples)} task prompts, gen 32, {repeats} repeats")
    by_label = {label: (config, steps, width) for label, config, steps, width in plans}

    def job(label: str, index: int, example: Any) -> Callable[[], dict[str, Any]]:
        config, steps, width = by_label[label]

        def call() -> dict[str, Any]:
            cpu_started = time.process_time()
            if steps is None:
                result = generate(model, [example.prompt], config)
                record = {"tokens": result.tokens[0].tolist(), "forwards": int(result.nfe[0]),
                          "rows": int(result.nfe[0]), "text": result.text[0]}
            else:
                spec = self_speculative_generate(model, example.prompt, config, draft_steps=steps,
                                                 branch=width)
                record = {"tokens": spec.result.tokens[0].tolist(), "forwards": spec.forwards,
                          "rows": spec.rows, "text": spec.result.text[0]}
            return record | {"cpu": time.process_time() - cpu_started}
        return call

    runs = interleave([(label, examples) for label, *_ in plans], repeats, job)

    def cpu(label: str) -> float:
        return statistics.median(sum(t.value["cpu"] for t in repeat) for repeat in runs[label].runs)

    base = plans[0][0]
    entries = []
    for label, config, steps, width in plans:
        outcome = runs[label].values()
        reference = runs[plans[0 if config is stepwise else 3][0]].values()
        entries.append({
            "label": label, "draft_steps": steps, "branch": width,
            "forwards": statistics.fmean(o["forwards"] for o in outcome),
            "rows": statistics.fmean(o["rows"] for o in outcome),
            "seconds": runs[label].seconds(), "speedup_vs_one_per_step": speedup(runs[base], runs[label]),
            "cpu_speedup_vs_one_per_step": cpu(base) / cpu(label),
            "identical_rate": statistics.fmean(o["tokens"] == ref["tokens"]
                                               for o, ref in zip(outcome, reference)),
            "accuracy": statistics.fmean(TASKS[e.task].score(e, o["text"] or "")
                                         for e, o in zip(examples, outcome)),
        })
    for e in entries:
        e["forward_reduction"] = entries[0]["forwards"] / e["forwards"]
    return {"prompts": len(examples), "gen_length": 32, "rows": entries}


AR_COLUMNS = [("tok/call", "mean_accepted_tokens", "{:.2f}"), ("alpha", "acceptance_rate", "{:.2f}"),
              ("nodes", "nodes_per_call", "{:.1f}"), ("D fwd/tok", "draft_forwards_per_token", "{:.2f}"),
              ("wall", "speedup", "{:.2f}x"), ("cpu", "cpu_speedup", "{:.2f}x"),
              ("ident.", "identical_rate", "{:.0%}"), ("acc", "accuracy", "{:.1%}")]
SELF_COLUMNS = [("NFE", "forwards", "{:.2f}"), ("rows", "rows", "{:.1f}"),
                ("NFE cut", "forward_reduction", "{:.2f}x"), ("wall", "speedup_vs_one_per_step", "{:.2f}x"),
                ("cpu", "cpu_speedup_vs_one_per_step", "{:.2f}x"), ("ident.", "identical_rate", "{:.0%}"),
                ("acc", "accuracy", "{:.1%}")]


def format_tree(report: dict[str, Any]) -> str:
    """The AR table per target runtime, the tree/chain ratios, the self-speculation table."""
    lines: list[str] = []
    for runtime, part in report.get("ar", {}).items():
        lines += [f"AR pair, target runtime {runtime}, {part['prompts']} prompts",
                  *table(part["rows"], AR_COLUMNS),
                  "  tokens per target call, tree / chain: " + ", ".join(
                      f"{k} {v:.2f}x" for k, v in part["tree_over_chain_tokens_per_call"].items()), ""]
    if "self_speculation" in report:
        part = report["self_speculation"]
        lines += [f"dLLM self-speculation, {part['prompts']} prompts, gen {part['gen_length']}",
                  *table(part["rows"], SELF_COLUMNS),
                  "  (identical: to one token per step for its self-speculation, to threshold "
                  "decoding for threshold's)"]
    return "\n".join(lines).rstrip() or "nothing measured (both parts skipped)"


def table(entries: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> list[str]:
    """One row per entry: its label, then (heading, key, format) columns."""
    width = max(len("configuration"), *(len(e["label"]) for e in entries)) + 1
    cells = [[fmt.format(e[key]) for _, key, fmt in columns] for e in entries]
    sizes = [max(len(heading), *(len(row[i]) for row in cells)) for i, (heading, _, _) in enumerate(columns)]
    head = f"{'configuration':<{width}}" + " ".join(f"{h:>{n}}" for (h, _, _), n in zip(columns, sizes))
    return [head, "-" * len(head), *(f"{e['label']:<{width}}" + " ".join(f"{c:>{n}}" for c, n in zip(row, sizes))
                                      for e, row in zip(entries, cells))]


def parse_rollbacks(text: str) -> list[float | None]:
    """`none,1,2` -> [None, 1.0, 2.0] (alpha_rb in nats; `none` = exact verification).

    Raises:
        ValueError: an item that is neither a number nor `none`.
    """
    try:
        return [None if part.strip().lower() == "none" else float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"expected a comma list of nats or `none`, got {text!r}") from None
