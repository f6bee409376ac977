"""`dllm-decode bench`: speed and quality of the whole toolkit side by side, as ratios, in one run.

    dllm-decode bench [--json FILE] [--quick] [--model embedded] [--repeats 3]

Counted as design §5 says: NFE (forward passes, refreshes included), tokens per step (canvas
length / NFE), accuracy (the task's metric, in percent), seconds (median of interleaved repeats),
overhead (share of wall-clock outside model forwards, timed by wrapping `forward`). Sections:

1. loop: overhead and generated tokens per second at batch 1, 4 and 16, for one token per step
   without cache (`low_confidence`, LLaDA) and for the full stack (best scheduler + dual cache +
   EoTP).
2. schedulers: every registered scheduler at its paper defaults, plus the tuned presets
   (`dllm_decode.eval.harness.presets`), without cache, relative to one token per step and to the oracle.
3. stack: cache and filter speedups, and the full stack against one token per step.
4. oracle gap: how long tokens stay correct before one token per step commits them (traces).
5. AR: plain greedy AR against AR + speculative decoding (`dllm_decode.speculative`).

The model is the embedded one; without it, `tiny_llada` (random weights, no task accuracy),
labelled as such. `--quick` is a seconds-long configuration for tests.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.interfaces import NoCache, Scheduler
from dllm_decode.eval.bench.measure import Combo, Measured, Sample, chunked, decode_once, run_grid

TARGET_TASKS = ("copy", "reverse", "sort", "insert_index", "remove_index", "replace_index", "sudoku")
"""The tasks the accuracy targets name (issue 9): copy, reverse, sort, the index variants, Sudoku."""
ACCURACY_SLACK = 1.0
"""Points of mean accuracy a faster configuration may lose against one token per step."""
BASELINE = "low_confidence"


@dataclass(frozen=True)
class Options:
    """One benchmark configuration (`--quick` swaps in `QUICK`)."""

    gen: int = 256
    block: int = 32
    per_task: int = 8
    batch: int = 8
    batch_sizes: tuple[int, ...] = (1, 4, 16)
    repeats: int = 3
    scheduler_repeats: int = 1
    ar_samples: int = 14
    ar_new_tokens: int = 32
    seed: int = 0


QUICK = Options(gen=16, block=8, per_task=1, batch=2, batch_sizes=(1, 2), repeats=1,
                ar_samples=2, ar_new_tokens=8)


@dataclass
class Subject:
    """The model under test, its tokenizer and task suite (None for the random fallback)."""

    model: Any
    label: str
    tokenizer: Any
    tasks: dict | None


def machine(threads: int) -> dict[str, Any]:
    """CPU model, cores, torch version and threads: the context every figure depends on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "threads": threads,
            "python": platform.python_version(), "load_average": list(os.getloadavg())}


def load_subject(name: str) -> Subject:
    """`embedded` (or a directory) with the task suite; `tiny`, or `embedded` when it is not
    installed: `tiny_llada` with random weights (its outputs are noise: no accuracy)."""
    from dllm_decode.models import ModelLoadError, load_model
    from dllm_decode.testing import tiny_llada_with_tokenizer

    if name != "tiny":
        try:
            model = load_model(name)
            from dllm_decode.eval.tasks import TASKS

            return Subject(model, f"{name} ({getattr(model, 'name_or_path', name)})",
                           getattr(model, "tokenizer", None), TASKS)
        except ModelLoadError:
            if name != "embedded":
                raise
    model = tiny_llada_with_tokenizer()
    why = "requested" if name == "tiny" else "the embedded model is not installed"
    return Subject(model, f"TINY RANDOM tiny_llada ({why}): speed only, outputs are noise",
                   model.tokenizer, None)


def samples_for(subject: Subject, options: Options) -> list[Sample]:
    """The fixed test slice: `per_task` test examples of each target task, interleaved by task
    (so any prefix mixes tasks); random word prompts for the tiny fallback."""
    if subject.tasks is None:
        rng = random.Random(options.seed)
        n = 2 * options.per_task
        return [Sample("random", [rng.randrange(1, subject.model.vocab_size - 2)
                                  for _ in range(4 + i % 5)]) for i in range(n)]
    pools = [[Sample(name, e.prompt, e) for e in
              subject.tasks[name].examples("test", options.per_task, options.seed)]
             for name in TARGET_TASKS if name in subject.tasks]
    return [pool[i] for i in range(options.per_task) for pool in pools]


def scored(subject: Subject, samples: list[Sample], texts: list[str]) -> dict[str, float] | None:
    """Accuracy (%) per task and the mean over tasks; None without a task suite."""
    if subject.tasks is None:
        return None
    by_task: dict[str, list[float]] = {}
    for sample, text in zip(samples, texts):
        by_task.setdefault(sample.task, []).append(subject.tasks[sample.task].score(sample.example, text))
    out = {task: 100 * sum(v) / len(v) for task, v in by_task.items()}
    out["mean"] = statistics.fmean(out.values())
    return out


def row(subject: Subject, samples: list[Sample], m: Measured, gen: int) -> dict[str, Any]:
    """The figures of one combo over the slice."""
    nfe = m.nfe()
    results = m.results()
    answer = [int(n) for r in results for n in r.answer_lengths.tolist()]
    seconds = m.seconds()
    return {"label": m.combo.label, "nfe": statistics.fmean(nfe),
            "tokens_per_step": statistics.fmean(gen / n for n in nfe),
            "answer_tokens_per_step": statistics.fmean(a / n for a, n in zip(answer, nfe)),
            "accuracy": scored(subject, samples, m.texts()), "seconds": seconds,
            "seconds_per_sample": seconds / len(samples), "overhead": m.overhead()}


def relative(rows: list[dict[str, Any]], base: str, suffix: str) -> None:
    """Add `nfe_vs_<suffix>`, `speedup_vs_<suffix>` and `accuracy_delta_vs_<suffix>` to each row."""
    ref = next(r for r in rows if r["label"] == base)
    for r in rows:
        r[f"nfe_vs_{suffix}"] = r["nfe"] / ref["nfe"]
        r[f"speedup_vs_{suffix}"] = ref["seconds"] / r["seconds"]
        if r["accuracy"] is not None:
            r[f"accuracy_delta_vs_{suffix}"] = r["accuracy"]["mean"] - ref["accuracy"]["mean"]
            r[f"worst_task_delta_vs_{suffix}"] = min(r["accuracy"][t] - ref["accuracy"][t]
                                                     for t in r["accuracy"] if t != "mean")


def scheduler_combos(tokenizer: Any) -> list[Combo]:
    """Every registered scheduler at its defaults (the oracle following one token per step), and
    the tuned presets."""
    from dllm_decode.eval.harness.presets import PRESETS
    from dllm_decode.schedulers import SCHEDULERS, with_delimiters

    combos = [Combo(BASELINE, SCHEDULERS[BASELINE]())]
    combos += [Combo(name, with_delimiters(cls(), tokenizer)) for name, cls in sorted(SCHEDULERS.items())
               if name not in (BASELINE, "oracle")]
    presets = {name: p.config() for name, p in PRESETS.items()}
    combos += [Combo(f"preset:{name}", with_delimiters(c.scheduler, tokenizer), filters=c.filters)
               for name, c in presets.items()]
    return combos + [Combo("oracle", None, oracle=True, reference=BASELINE)]


def best_of(rows: list[dict[str, Any]]) -> str:
    """The fewest-NFE non-oracle row whose mean accuracy is within the slack of one token per
    step (any row when accuracy is unknown)."""
    ok = [r for r in rows if r["label"] != "oracle" and
          (r["accuracy"] is None or r["accuracy_delta_vs_baseline"] >= -ACCURACY_SLACK)]
    return min(ok, key=lambda r: (r["nfe"], -r["speedup_vs_baseline"]))["label"]


def section_schedulers(subject: Subject, samples: list[Sample], o: Options) -> dict[str, Any]:
    combos = scheduler_combos(subject.tokenizer)
    chunks = chunked(samples, o.batch)
    measured = run_grid(subject.model, [(c, chunks) for c in combos], o.gen, o.block,
                        o.scheduler_repeats, subject.tokenizer)
    rows = [row(subject, samples, m, o.gen) for m in measured.values()]
    relative(rows, BASELINE, "baseline")
    relative(rows, "oracle", "oracle")
    return {"rows": rows, "best": best_of(rows), "combos": {c.label: c for c in combos}}


SUFFIX_DUAL = "dual(suffix)"
"""Label of the dual cache that recomputes the whole prefix each step and caches only the suffix."""


def stack_combos(best: Combo) -> list[Combo]:
    """One token per step without cache, then for `threshold` (Fast-dLLM's default) and the best
    configuration: no cache, prefix, dual, + EoTP, dual + EoTP (the full stack). A configuration
    whose filters already hold an EoTP filter keeps it instead of adding a second one. The full
    stack also runs with the suffix-only dual cache (`prefix_look` over the whole prefix, dInfer's
    vicinity refresh): short prompts make the prefix cheap to recompute, and its stale K/V is what
    costs this small model accuracy under the plain dual cache."""
    from dllm_decode.caches import DualCache, PrefixCache
    from dllm_decode.filters import EoTPFilter
    from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler

    out = [Combo(BASELINE, LowConfidenceScheduler())]
    for base in (Combo("threshold", ThresholdScheduler()), best):
        if any(c.label == base.label for c in out):
            continue
        eotp = base.filters if any(isinstance(f, EoTPFilter) for f in base.filters) else \
            base.filters + (EoTPFilter(),)
        out += [replace(base, cache=NoCache()), replace(base, label=f"{base.label}+prefix", cache=PrefixCache()),
                replace(base, label=f"{base.label}+dual", cache=DualCache()),
                replace(base, label=f"{base.label}+eotp", cache=NoCache(), filters=eotp),
                replace(base, label=f"{base.label}+dual+eotp", cache=DualCache(), filters=eotp),
                replace(base, label=f"{base.label}+dual(refresh 2)+eotp", cache=DualCache(refresh_every=2),
                        filters=eotp),
                replace(base, label=f"{base.label}+{SUFFIX_DUAL}+eotp", cache=DualCache(prefix_look=1 << 20),
                        filters=eotp)]
    return out


def section_stack(subject: Subject, samples: list[Sample], o: Options, best: Combo) -> dict[str, Any]:
    combos = stack_combos(best)
    chunks = chunked(samples, o.batch)
    measured = run_grid(subject.model, [(c, chunks) for c in combos], o.gen, o.block, o.repeats,
                        subject.tokenizer)
    rows = [row(subject, samples, m, o.gen) for m in measured.values()]
    relative(rows, BASELINE, "baseline")
    by = {r["label"]: r for r in rows}
    speedups = {}
    for name in dict.fromkeys(["threshold", best.label]):
        if name == BASELINE:
            continue
        speedups[name] = {
            "prefix_cache": by[name]["seconds"] / by[f"{name}+prefix"]["seconds"],
            "dual_cache": by[name]["seconds"] / by[f"{name}+dual"]["seconds"],
            "eotp_filter": by[name]["seconds"] / by[f"{name}+eotp"]["seconds"],
            "eotp_on_dual": by[f"{name}+dual"]["seconds"] / by[f"{name}+dual+eotp"]["seconds"],
            "full_stack_vs_baseline": by[BASELINE]["seconds"] / by[f"{name}+dual+eotp"]["seconds"],
        }
    return {"rows": rows, "speedups": speedups, "full_stack": f"{best.label}+dual+eotp",
            "full_stacks": [f"{best.label}+dual+eotp", f"{best.label}+{SUFFIX_DUAL}+eotp"]}


def section_loop(subject: Subject, samples: list[Sample], o: Options, stack: Combo) -> dict[str, Any]:
    """Overhead and tokens/s at each batch size: the same prompts, cut into batches of b."""
    from dllm_decode.schedulers import LowConfidenceScheduler

    prompts = samples[:max(o.batch_sizes)]
    combos = [Combo(BASELINE, LowConfidenceScheduler()), stack]
    plans = [(replace(c, label=f"{c.label}@B{b}"), chunked(prompts, b)) for c in combos
             for b in o.batch_sizes]
    measured = run_grid(subject.model, plans, o.gen, o.block, o.repeats, subject.tokenizer)
    rows = []
    for combo in combos:
        first = None
        for b in o.batch_sizes:
            m = measured[f"{combo.label}@B{b}"]
            tps = o.gen * len(prompts) / m.seconds()
            first = first or tps
            rows.append({"config": combo.label, "batch": b, "seconds": m.seconds(),
                         "tokens_per_second": tps, "vs_batch_1": tps / first,
                         "overhead": m.overhead(), "nfe": statistics.fmean(m.nfe())})
    return {"prompts": len(prompts), "rows": rows}


def section_gap(subject: Subject, samples: list[Sample], o: Options) -> dict[str, Any]:
    """Trace one token per step on the slice; summarize how long tokens wait (`dllm_decode.eval.bench.oracle_gap`)."""
    from dllm_decode.eval.bench.oracle_gap import add_chunk, summarize
    from dllm_decode.schedulers import LowConfidenceScheduler

    groups: dict[str, dict[str, list]] = {}
    combo = Combo(BASELINE, LowConfidenceScheduler())
    for chunk in chunked(samples, o.batch):
        result = decode_once(subject.model, [s.prompt for s in chunk], combo, combo.scheduler,
                             o.gen, o.block, subject.tokenizer, trace=True)[3]
        add_chunk(groups, result, [s.task for s in chunk], subject.model.eos_token_ids)
    return summarize(groups)


def section_ar(subject: Subject, samples: list[Sample], o: Options) -> dict[str, Any]:
    """Plain greedy AR vs AR + a draft model (speculative, greedy verification), batch 1. The
    target runs in transformers; the draft in the compact runtime (the CLI's default for drafts)."""
    from dllm_decode.models import ModelLoadError
    from dllm_decode.speculative import ModelDrafter, SpecConfig, speculative_generate, with_runtime
    from dllm_decode.speculative.models import load_causal_lm
    from dllm_decode.speculative.schedule import HeuristicScheduler

    try:
        target, draft = load_causal_lm("ar_target"), load_causal_lm("ar_draft")
    except ModelLoadError as err:
        return {"skipped": str(err)}
    config = SpecConfig(scheduler=HeuristicScheduler(), max_new_tokens=o.ar_new_tokens)
    drafters = {"ar": None, "ar+speculative": ModelDrafter(with_runtime(draft, "auto"))}
    picked = samples[:o.ar_samples]
    seconds = {k: [] for k in drafters}
    outputs: dict[str, list] = {k: [] for k in drafters}
    for repeat in range(o.repeats):
        totals = dict.fromkeys(drafters, 0.0)
        for i, sample in enumerate(picked):
            for name in (list(drafters)[::-1] if (i + repeat) % 2 else list(drafters)):
                prompt = sample.prompt if not isinstance(sample.prompt, str) else f"{sample.prompt} ="
                result = speculative_generate(target, prompt, config, drafters[name])
                totals[name] += result.seconds
                if repeat == 0:
                    outputs[name].append(result)
        for name in drafters:
            seconds[name].append(totals[name])
    rows = {}
    for name in drafters:
        results = outputs[name]
        texts = [r.text or "" for r in results]
        rows[name] = {"seconds": statistics.median(seconds[name]),
                      "target_forwards_per_token": statistics.fmean(
                          r.target_forwards / max(1, len(r.tokens)) for r in results),
                      "mean_accepted": statistics.fmean(r.mean_accepted for r in results),
                      "accuracy": scored(subject, picked, texts)}
    rows["ar+speculative"]["speedup_vs_ar"] = rows["ar"]["seconds"] / rows["ar+speculative"]["seconds"]
    same = [a.tokens.tolist() == b.tokens.tolist() for a, b in zip(outputs["ar"], outputs["ar+speculative"])]
    rows["ar+speculative"]["same_output_as_ar"] = 100 * sum(same) / len(same)   # greedy: must be 100
    return {"samples": len(picked), "max_new_tokens": o.ar_new_tokens, "rows": rows}


def section_compile(subject: Subject, samples: list[Sample], o: Options) -> dict[str, Any]:
    """Median milliseconds of one forward, eager vs `torch.compile` (static shapes), for a full
    step (no cache or a refresh) and a dual-cache step, at batch 1 on the first sample's canvas,
    and the one-off compile seconds. Opt-in (`--section compile`): compiling takes minutes on CPU
    and recompiles for every new canvas width, which is why the loop runs eager."""
    from dllm_decode.models.layers import KVCache
    from dllm_decode.prompts import encode_prompts, left_pad

    model = subject.model
    ids = encode_prompts([samples[0].prompt], subject.tokenizer)
    canvas, mask = left_pad(ids, o.gen, model.mask_token_id, model.eos_token_ids[0], torch.device("cpu"))
    start, length = canvas.shape[1] - o.gen, canvas.shape[1]

    def median_ms(forward: Any, kv: Any, rows: tuple[int, int]) -> float:
        forward(canvas, mask, kv=kv, rows=rows)
        times = []
        for _ in range(max(5, 3 * o.repeats)):
            started = time.perf_counter()
            forward(canvas, mask, kv=kv, rows=rows)
            times.append(1000 * (time.perf_counter() - started))
        return statistics.median(times)

    out: dict[str, Any] = {}
    with torch.inference_mode():
        kv = KVCache()
        model(canvas, mask, kv=kv, rows=(start, length))
        eager = {"full": median_ms(model, None, (start, start + o.block)),
                 "dual": median_ms(model, kv, (start, start + o.block))}
        started = time.perf_counter()
        compiled = torch.compile(model.forward, dynamic=False)
        try:
            fast = {"full": median_ms(compiled, None, (start, start + o.block)),
                    "dual": median_ms(compiled, kv, (start, start + o.block))}
        except Exception as err:                  # no compiler toolchain, unsupported op, ...
            return {"failed": f"{type(err).__name__}: {err}"[:300], "eager_ms": eager}
        out["compile_seconds"] = time.perf_counter() - started
    out.update({"eager_ms": eager, "compiled_ms": fast,
                "speedup": {k: eager[k] / fast[k] for k in eager}})
    return out


def run(model_name: str = "embedded", options: Options = Options(), threads: int = 1,
        sections: tuple[str, ...] = ("loop", "schedulers", "stack", "gap", "ar"),
        progress: Any = None) -> dict[str, Any]:
    """Run the benchmark; returns the JSON-ready report."""
    torch.set_num_threads(threads)
    say = progress or (lambda line: None)
    subject = load_subject(model_name)
    samples = samples_for(subject, options)
    out: dict[str, Any] = {"machine": machine(threads), "model": subject.label,
                           "options": options.__dict__, "samples": len(samples),
                           "tasks": sorted({s.task for s in samples})}
    decode_once(subject.model, [samples[0].prompt], Combo("warmup", None), _warmup(),
                options.block, options.block, subject.tokenizer)
    started = time.perf_counter()
    say(f"model: {subject.label}; {len(samples)} samples")
    sched = section_schedulers(subject, samples, options)
    combos = sched.pop("combos")
    best = combos[sched["best"]]
    out["schedulers"] = sched
    say(f"schedulers done ({time.perf_counter() - started:.0f}s); best: {best.label}")
    stack = stack_combos(best)[-1]
    if "stack" in sections:
        out["stack"] = section_stack(subject, samples, options, best)
        say(f"stack done ({time.perf_counter() - started:.0f}s)")
    if "loop" in sections:
        out["loop"] = section_loop(subject, samples, options, stack)
        say(f"loop done ({time.perf_counter() - started:.0f}s)")
    if "gap" in sections:
        out["oracle_gap"] = section_gap(subject, samples, options)
    if "ar" in sections:
        out["ar"] = section_ar(subject, samples, options)
        say(f"ar done ({time.perf_counter() - started:.0f}s)")
    if "compile" in sections:
        out["compile"] = section_compile(subject, samples, options)
    out["targets"] = targets(out)
    out["seconds_total"] = time.perf_counter() - started
    return out


def _warmup() -> Scheduler:
    from dllm_decode.schedulers import ThresholdScheduler

    return ThresholdScheduler()


def targets(report: dict[str, Any]) -> dict[str, Any]:
    """The issue's four targets, each with the measured value and whether it is met."""
    out: dict[str, Any] = {}
    rows = {r["label"]: r for r in report["schedulers"]["rows"]}
    best = rows[report["schedulers"]["best"]]
    out["nfe_vs_oracle<=1.25"] = {"value": best["nfe_vs_oracle"], "config": best["label"],
                                  "accuracy_delta": best.get("accuracy_delta_vs_baseline"),
                                  "met": best["nfe_vs_oracle"] <= 1.25}
    if "loop" in report:
        for r in report["loop"]["rows"]:
            if r["batch"] == 1:
                out[f"overhead<=10% ({r['config']})"] = {"value": r["overhead"], "met": r["overhead"] <= 0.10}
            if r["batch"] == max(x["batch"] for x in report["loop"]["rows"]):
                out[f"tok/s B{r['batch']} >= 4x B1 ({r['config']})"] = {"value": r["vs_batch_1"],
                                                                       "met": r["vs_batch_1"] >= 4}
    if "stack" in report:
        by = {r["label"]: r for r in report["stack"]["rows"]}
        for label in report["stack"].get("full_stacks", [report["stack"]["full_stack"]]):
            full = by[label]
            delta = full.get("accuracy_delta_vs_baseline")
            out[f"full stack >= 15x ({label})"] = {
                "value": full["speedup_vs_baseline"], "config": label, "accuracy_delta": delta,
                "met": full["speedup_vs_baseline"] >= 15 and (delta is None or delta >= -ACCURACY_SLACK)}
    return out


def _pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{x:6.1f}"


def format_report(report: dict[str, Any]) -> str:
    """The report as plain-text tables (every figure is also in the JSON)."""
    m, o = report["machine"], report["options"]
    lines = [f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['threads']} thread(s), "
             f"load {m['load_average'][0]:.1f}",
             f"model: {report['model']}",
             f"slice: {report['samples']} samples ({', '.join(report['tasks'])}); gen {o['gen']}, "
             f"block {o['block']}, batch {o['batch']}, median of {o['repeats']} interleaved repeats"]
    if "loop" in report:
        lines += ["", f"loop ({report['loop']['prompts']} prompts, gen {o['gen']}):",
                  f"  {'config':<34} {'B':>3} {'tok/s':>8} {'xB1':>6} {'overhead':>9} {'NFE':>6}"]
        lines += [f"  {r['config']:<34} {r['batch']:>3} {r['tokens_per_second']:>8.1f} "
                  f"{r['vs_batch_1']:>5.2f}x {100 * r['overhead']:>8.1f}% {r['nfe']:>6.1f}"
                  for r in report["loop"]["rows"]]
    sched = report["schedulers"]
    lines += ["", f"schedulers (no cache, {o['scheduler_repeats']} repeat(s); best within "
                  f"{ACCURACY_SLACK:g} point of {BASELINE}: {sched['best']}):",
              f"  {'scheduler':<26} {'NFE':>6} {'tok/step':>8} {'acc%':>6} {'dAcc':>6} {'NFE/1tps':>8} "
              f"{'NFE/orc':>7} {'speedup':>7} {'s/sample':>8} {'ovh%':>5}"]
    for r in sched["rows"]:
        acc = r["accuracy"]["mean"] if r["accuracy"] else None
        lines.append(f"  {r['label']:<26} {r['nfe']:>6.2f} {r['tokens_per_step']:>8.2f} {_pct(acc)} "
                     f"{_pct(r.get('accuracy_delta_vs_baseline'))} {r['nfe_vs_baseline']:>8.3f} "
                     f"{r['nfe_vs_oracle']:>7.3f} {r['speedup_vs_baseline']:>6.2f}x "
                     f"{r['seconds_per_sample']:>8.4f} {100 * r['overhead']:>5.1f}")
    if sched["rows"][0]["accuracy"]:
        tasks = [t for t in sched["rows"][0]["accuracy"] if t != "mean"]
        lines += ["", "  accuracy by task: " + " ".join(f"{t[:10]:>10}" for t in tasks)]
        lines += [f"  {r['label']:<26}" + " ".join(f"{r['accuracy'][t]:>10.1f}" for t in tasks)
                  for r in sched["rows"]]
    if "stack" in report:
        lines += ["", "stack (cache and filter speedups):",
                  f"  {'config':<34} {'NFE':>6} {'acc%':>6} {'dAcc':>6} {'speedup':>8} {'s/sample':>8} {'ovh%':>5}"]
        for r in report["stack"]["rows"]:
            acc = r["accuracy"]["mean"] if r["accuracy"] else None
            lines.append(f"  {r['label']:<34} {r['nfe']:>6.2f} {_pct(acc)} "
                         f"{_pct(r.get('accuracy_delta_vs_baseline'))} {r['speedup_vs_baseline']:>7.2f}x "
                         f"{r['seconds_per_sample']:>8.4f} {100 * r['overhead']:>5.1f}")
        for name, s in report["stack"]["speedups"].items():
            lines.append(f"  {name}: " + ", ".join(f"{k} {v:.2f}x" for k, v in s.items()))
    if report.get("oracle_gap"):
        lines += ["", "oracle gap (one token per step, answer tokens): steps a token is already final "
                      "before its commit; confidence when that run began; wrong candidates' confidence",
                  f"  {'task':<14} {'tokens':>6} {'mean wait':>9} {'max':>4} {'start p10':>9} "
                  f"{'start p50':>9} {'wrong n':>7} {'wrong p90':>9} {'wrong max':>9}"]
        for task, g in report["oracle_gap"].items():
            lines.append(f"  {task:<14} {g['answer_tokens']:>6} {g['mean_wait_steps']:>9.2f} "
                         f"{g['max_wait_steps']:>4} {_f(g['start_confidence_p10'])} "
                         f"{_f(g['start_confidence_median'])} {g['wrong_candidates']:>7} "
                         f"{_f(g['wrong_confidence_p90'])} {_f(g['wrong_confidence_max'])}")
    if "compile" in report:
        c = report["compile"]
        lines += ["", "torch.compile (one forward, batch 1): " + (
            c["failed"] if "failed" in c else
            ", ".join(f"{k} eager {c['eager_ms'][k]:.2f} ms, compiled {c['compiled_ms'][k]:.2f} ms "
                      f"({c['speedup'][k]:.2f}x)" for k in c["eager_ms"])
            + f"; compiling took {c['compile_seconds']:.0f} s")]
    if "ar" in report:
        ar = report["ar"]
        if "skipped" in ar:
            lines += ["", f"AR: skipped ({ar['skipped']})"]
        else:
            lines += ["", f"AR ({ar['samples']} samples, batch 1, up to {ar['max_new_tokens']} new tokens):"]
            for name, r in ar["rows"].items():
                acc = r["accuracy"]["mean"] if r["accuracy"] else None
                lines.append(f"  {name:<16} acc {_pct(acc)}%  {r['seconds']:.3f}s  target forwards/token "
                             f"{r['target_forwards_per_token']:.3f}  accepted/forward {r['mean_accepted']:.2f}"
                             + (f"  speedup {r['speedup_vs_ar']:.2f}x, same output as AR "
                                f"{r['same_output_as_ar']:.0f}%" if "speedup_vs_ar" in r else ""))
    lines += ["", "targets:"]
    for name, t in report["targets"].items():
        lines.append(f"  [{'met' if t['met'] else 'MISSED'}] {name}: {t['value']:.3f}"
                     + (f" ({t['config']})" if "config" in t else "")
                     + (f", accuracy delta {t['accuracy_delta']:+.1f}" if t.get("accuracy_delta") is not None else ""))
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "      n/a" if x is None else f"{x:>9.3f}"
