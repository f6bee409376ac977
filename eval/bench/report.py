"""Plain-text tables of the benchmark reports (every figure is also in the JSON).

Figures and ratios only: which of them meet a goal is for the reader (the README keeps the
targets).
"""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.sections import ACCURACY_SLACK, BASELINE


def _pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{x:6.1f}"


def _f(x: float | None) -> str:
    return "      n/a" if x is None else f"{x:>9.3f}"


def _mean(accuracy: dict[str, float] | None) -> float | None:
    return accuracy["mean"] if accuracy else None


def machine_line(report: dict[str, Any]) -> str:
    m = report["machine"]
    return (f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['threads']} thread(s), "
            f"load {m['load_average'][0]:.1f}")


def header(report: dict[str, Any], setting: str, repeats: int) -> list[str]:
    """Machine, model, and the setting with how many interleaved repeats the medians are over."""
    return [machine_line(report), f"model: {report['model']}",
            f"{setting}, median of {repeats} interleaved repeat(s)"]


def format_suite(report: dict[str, Any]) -> str:
    """The suite's sections, in the order they ran."""
    o = report["options"]
    lines = header(report, f"slice: {report['samples']} samples ({', '.join(report['tasks'])}); gen "
                           f"{o['gen_length']}, block {o['block_length']}, batch {o['batch']}", o["repeats"])
    for key, part in (("schedulers", schedulers_table), ("stack", stack_table), ("loop", loop_table),
                      ("oracle_gap", gap_table), ("ar", ar_table), ("compile", compile_line)):
        if key in report:
            lines += ["", *part(report[key], o)]
    return "\n".join(lines)


def schedulers_table(sched: dict[str, Any], o: dict[str, Any]) -> list[str]:
    lines = [f"schedulers (no cache, {sched['repeats']} repeat(s); fewest NFE within "
             f"{ACCURACY_SLACK:g} point of {BASELINE}: {sched['best']}):",
             f"  {'scheduler':<26} {'NFE':>6} {'tok/step':>8} {'acc%':>6} {'dAcc':>6} {'NFE/1tps':>8} "
             f"{'NFE/orc':>7} {'speedup':>7} {'s/sample':>8} {'ovh%':>5}"]
    for r in sched["rows"]:
        lines.append(f"  {r['label']:<26} {r['nfe']:>6.2f} {r['tokens_per_step']:>8.2f} "
                     f"{_pct(_mean(r['accuracy']))} {_pct(r.get('accuracy_delta_vs_baseline'))} "
                     f"{r['nfe_vs_baseline']:>8.3f} {r['nfe_vs_oracle']:>7.3f} "
                     f"{r['speedup_vs_baseline']:>6.2f}x {r['seconds_per_sample']:>8.4f} {100 * r['overhead']:>5.1f}")
    if sched["rows"][0]["accuracy"]:
        tasks = [t for t in sched["rows"][0]["accuracy"] if t != "mean"]
        lines += ["", "  accuracy by task: " + " ".join(f"{t[:10]:>10}" for t in tasks)]
        lines += [f"  {r['label']:<26}" + " ".join(f"{r['accuracy'][t]:>10.1f}" for t in tasks)
                  for r in sched["rows"]]
    return lines


def stack_table(stack: dict[str, Any], o: dict[str, Any]) -> list[str]:
    lines = [f"stack (cache and filter speedups; best scheduler: {stack['best']}):",
             f"  {'config':<38} {'NFE':>6} {'acc%':>6} {'dAcc':>6} {'speedup':>8} {'s/sample':>8} "
             f"{'ans tok/s':>9} {'ovh%':>5}"]
    for r in stack["rows"]:
        lines.append(f"  {r['label']:<38} {r['nfe']:>6.2f} {_pct(_mean(r['accuracy']))} "
                     f"{_pct(r.get('accuracy_delta_vs_baseline'))} {r['speedup_vs_baseline']:>7.2f}x "
                     f"{r['seconds_per_sample']:>8.4f} {r['answer_tokens_per_second']:>9.1f} "
                     f"{100 * r['overhead']:>5.1f}")
    for name, s in stack["speedups"].items():
        lines.append(f"  {name}: " + ", ".join(f"{k} {v:.2f}x" for k, v in s.items()))
    return lines


def loop_table(loop: dict[str, Any], o: dict[str, Any]) -> list[str]:
    lines = [f"loop ({loop['prompts']} prompts, gen {o['gen_length']}):",
             f"  {'config':<38} {'B':>3} {'tok/s':>8} {'ans tok/s':>9} {'xB1':>6} {'overhead':>9} {'NFE':>6}"]
    lines += [f"  {r['config']:<38} {r['batch']:>3} {r['tokens_per_second']:>8.1f} "
              f"{r['answer_tokens_per_second']:>9.1f} {r['vs_batch_1']:>5.2f}x {100 * r['overhead']:>8.1f}% "
              f"{r['nfe']:>6.1f}" for r in loop["rows"]]
    return lines


def gap_table(gap: dict[str, Any], o: dict[str, Any]) -> list[str]:
    lines = ["oracle gap (one token per step, answer tokens): steps a token is already final before "
             "its commit; confidence when that run began; wrong candidates' confidence",
             f"  {'task':<14} {'tokens':>6} {'mean wait':>9} {'max':>4} {'start p10':>9} "
             f"{'start p50':>9} {'wrong n':>7} {'wrong p90':>9} {'wrong max':>9}"]
    for task, g in gap.items():
        lines.append(f"  {task:<14} {g['answer_tokens']:>6} {g['mean_wait_steps']:>9.2f} "
                     f"{g['max_wait_steps']:>4} {_f(g['start_confidence_p10'])} "
                     f"{_f(g['start_confidence_median'])} {g['wrong_candidates']:>7} "
                     f"{_f(g['wrong_confidence_p90'])} {_f(g['wrong_confidence_max'])}")
    return lines


def ar_table(ar: dict[str, Any], o: dict[str, Any]) -> list[str]:
    if "skipped" in ar:
        return [f"AR: skipped ({ar['skipped']})"]
    return spec_table(f"AR ({ar['samples']} samples, batch 1, up to {ar['max_new_tokens']} new tokens):",
                      ar["rows"])


def compile_line(c: dict[str, Any], o: dict[str, Any]) -> list[str]:
    if "failed" in c:
        return [f"torch.compile (one forward, batch 1): {c['failed']}"]
    return ["torch.compile (one forward, batch 1): " + ", ".join(
        f"{k} eager {c['eager_ms'][k]:.2f} ms, compiled {c['compiled_ms'][k]:.2f} ms ({c['speedup'][k]:.2f}x)"
        for k in c["eager_ms"]) + f"; compiling took {c['compile_seconds']:.0f} s"]


def spec_table(title: str, entries: list[dict[str, Any]]) -> list[str]:
    head = (f"  {'configuration':<34} {'acc/call':>8} {'E[tok]':>7} {'alpha':>6} {'g':>5} "
            f"{'T fwd/tok':>9} {'D fwd/tok':>9} {'c':>5} {'E[spd]':>7} {'speedup':>7} {'same%':>5} {'acc%':>6}")
    lines = [title, head]
    for e in entries:
        lines.append(f"  {e['label']:<34} {e['mean_accepted_tokens']:>8.2f} {e['theory_tokens_per_call']:>7.2f} "
                     f"{e['acceptance_rate']:>6.2f} {e['mean_draft_length']:>5.2f} "
                     f"{e['target_forwards_per_token']:>9.3f} {e['draft_forwards_per_token']:>9.3f} "
                     f"{e['cost_ratio_c']:>5.2f} {e['theory_speedup']:>6.2f}x {e['speedup']:>6.2f}x "
                     f"{e['same_output']:>5.0f} {_pct(_mean(e.get('accuracy')))}")
    return lines


def format_spec(report: dict[str, Any]) -> str:
    lines = [machine_line(report)]
    for runtime, suite in (report.get("embedded") or {}).items():
        lines += ["", *spec_table(f"embedded AR pair ({suite['target']} / {suite['draft']}), target runtime "
                                  f"{runtime}, {suite['prompts']} task prompts:", suite["rows"])]
        by_task = next((e["tokens_per_call_by_task"] for e in suite["rows"] if e["label"] == "draft model, heuristic"),
                       None)
        if by_task:
            lines.append("  tokens per target call by task (draft model, heuristic): "
                         + ", ".join(f"{task} {value:.2f}" for task, value in by_task.items()))
    if report.get("smollm2"):
        lines += ["", *spec_table("SmolLM2-135M-Instruct (GGUF Q4_1 -> float32):", report["smollm2"]["rows"])]
    return "\n".join(lines)


def format_cache(report: dict[str, Any]) -> str:
    o = report["options"]
    lines = header(report, f"{report['prompts']} prompts ({', '.join(report['tasks'])}); block "
                           f"{o['block_length']}, threshold {o['threshold']}, stop_at_eos {o['stop_at_eos']}",
                   o["repeats"])
    lines += ["", "one forward at the first block (ms): full, prefix-cached, dual-cached (x: vs full)"]
    lines += [f"  gen {c['gen']:>4} B{c['batch']:<3} full {c['full']:8.1f}  prefix {c['prefix']:8.1f} "
              f"({c['full'] / c['prefix']:.2f}x)  dual {c['dual']:8.1f} ({c['full'] / c['dual']:.2f}x)"
              for c in report["forward_ms"]]
    lines += ["", f"  {'gen':>4} {'B':>3} {'cache':<24} {'s/sample':>9} {'ans tok/s':>9} {'tok/s':>8} "
                  f"{'ans tok':>7} {'NFE':>6} {'speedup':>8} {'vs_dual':>8} {'=none%':>6} {'acc%':>6}"]
    lines += [f"  {r['gen']:>4} {r['batch']:>3} {r['cache']:<24} {r['seconds_per_sample']:>9.4f} "
              f"{r['answer_tokens_per_second']:>9.1f} {r['tokens_per_second']:>8.1f} {r['answer_tokens']:>7.1f} "
              f"{r['nfe']:>6.2f} {r['speedup']:>7.2f}x {r['vs_dual']:>7.2f}x {r['same_tokens_as_none']:>6.1f} "
              f"{_pct(_mean(r['accuracy']))}" for r in report["rows"]]
    return "\n".join(lines)


def format_scaling(report: dict[str, Any]) -> str:
    o = report["options"]
    lines = header(report, f"{report['prompts']} prompts (longest {report['longest_prompt']} tokens, "
                           f"context {report['context']}); block {o['block_length']}, batch {o['batch']}",
                   o["repeats"])
    lines += ["", f"  {'config':<20} {'gen':>5} {'s/sample':>9} {'NFE':>7} {'ans tok':>7} {'ans tok/s':>9} {'tok/s':>8}"]
    lines += [f"  {r['config']:<20} {r['gen']:>5} {r['seconds_per_sample']:>9.4f} {r['nfe']:>7.2f} "
              f"{r['answer_tokens']:>7.1f} {r['answer_tokens_per_second']:>9.1f} {r['tokens_per_second']:>8.1f}"
              for r in report["rows"]]
    lines += ["", "fitted exponent k (seconds per sample ~ gen^k, log-log least squares):"]
    lines += [f"  {name:<20} " + ", ".join(f"gen {span}: {k:.2f}" for span, k in fit.items())
              for name, fit in report["exponents"].items()]
    return "\n".join(lines)
