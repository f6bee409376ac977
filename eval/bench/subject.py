"""What a benchmark runs on: the model under test, its prompts, their scores, the machine.

The model comes from a `--model` name (`dllm_decode.modelspec`): `embedded` or a directory is
scored on the task suite (`dllm_decode.eval.tasks`, test split); `tiny` decodes seeded random
word prompts (noise: speed only, no accuracy). When `embedded` is not installed, a random-weight
LLaDA of the embedded model's size stands in, labelled as such: its timings are realistic, its
outputs are noise (about one token per step under confidence rules).
"""

from __future__ import annotations

import os
import platform
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from dllm_decode.eval.bench.measure import Sample
from dllm_decode.modelspec import ModelSpec, load_diffusion

TARGET_TASKS = ("copy", "reverse", "sort", "insert_index", "remove_index", "replace_index", "sudoku")
"""The deterministic tasks the suite's scheduler and stack tables use (one reference answer)."""
EMBEDDED_SIZE = dict(d_model=192, n_heads=6, n_layers=4, mlp_hidden_size=512, vocab_size=129,
                     max_sequence_length=1024, mask_token_id=3, eos_token_id=2, pad_token_id=0)
"""The embedded dLLM's architecture (`dllm_decode/embedded/dllm/config.json`), for the stand-in."""


@dataclass(frozen=True)
class Subject:
    """The model under test, its tokenizer and task suite (None: prompts are random ids)."""

    model: Any
    label: str
    tokenizer: Any
    tasks: dict | None


def load_subject(name: str, canvases: tuple[str, ...] = ("mask",)) -> Subject:
    """The diffusion model a `--model` name means, with the task suite when it has a tokenizer;
    `canvases`: the canvas kinds the benchmark decodes (`serving` also takes a noise model).

    Raises:
        OptionError (a ValueError naming `--model`, one line): a name that is not a masked
            diffusion LM (`ideal`, `ar:...`, a uniform-noise model), or a missing or corrupt
            directory (`ModelLoadError`). Every benchmark's `--model` is checked here.
    """
    from dllm_decode.eval.bench.protocol import blame

    with blame("--model"):
        return _load_subject(name, canvases)


def _load_subject(name: str, canvases: tuple[str, ...]) -> Subject:
    from dllm_decode.models import ModelLoadError

    spec = diffusion_spec(name)
    try:
        model = load_diffusion(spec)
    except ModelLoadError:
        if spec.name != "embedded":
            raise
        return Subject(random_embedded(), "RANDOM-WEIGHT LLaDA at the embedded size (the embedded "
                       "model is not installed): speed only, outputs are noise", None, None)
    if getattr(model, "canvas_kind", "mask") not in canvases:
        raise ValueError(f"{name!r} is a uniform-noise model; the benchmark suite decodes masked "
                         f"models (measure it with `dllm-decode eval`, which reports NFE and time)")
    if spec.kind == "tiny":
        return Subject(model, "TINY RANDOM tiny_llada: speed only, outputs are noise", model.tokenizer, None)
    tokenizer = getattr(model, "tokenizer", None)
    tasks = None
    if tokenizer is not None:
        from dllm_decode.eval.tasks import TASKS as tasks
    return Subject(model, f"{name} ({getattr(model, 'name_or_path', name)})", tokenizer, tasks)


def diffusion_spec(name: str) -> ModelSpec:
    """The `ModelSpec` of a diffusion model name.

    Raises:
        ValueError: a malformed name, or one that is not a diffusion LM (`ideal`, `ar:...`).
    """
    spec = ModelSpec.parse(name)
    if spec.kind not in ("diffusion", "tiny"):
        raise ValueError(f"{name!r} is not a masked diffusion LM; benchmarks take `embedded`, "
                         f"`tiny` or a model directory")
    return spec


def random_embedded(seed: int = 0) -> Any:
    """A LLaDA with the embedded model's shapes and seeded random weights."""
    from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM

    generator = torch.Generator().manual_seed(seed)
    model = LLaDAModelLM(LLaDAConfig(**EMBEDDED_SIZE, rope_theta=10000.0))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.05 if p.dim() > 1 else torch.ones(p.shape))
    return model.eval()


def task_samples(tasks: dict, per_task: int, names: Sequence[str] | None = None, seed: int = 0) -> list[Sample]:
    """`per_task` test examples of each named task (None: every task), interleaved by task so
    any prefix mixes tasks; prompts as the tasks wrote them."""
    pools = [[Sample(name, e.prompt, e) for e in tasks[name].examples("test", per_task, seed)]
             for name in (sorted(tasks) if names is None else names) if name in tasks]
    return [pool[i] for i in range(per_task) for pool in pools]


def samples_for(subject: Subject, per_task: int, tasks: Sequence[str] | None = TARGET_TASKS,
                seed: int = 0) -> list[Sample]:
    """`task_samples` in the model's chat template (`chat_prompt`); without a task suite, as many
    seeded random word prompts of unequal lengths (left padding exercised)."""
    from dllm_decode.prompts import chat_prompt

    if subject.tasks is None:
        rng = random.Random(seed)
        special = {subject.model.mask_token_id, *subject.model.eos_token_ids}
        words = [t for t in range(1, subject.model.vocab_size) if t not in special]
        count = per_task * len(TARGET_TASKS if tasks is None else tasks)
        return [Sample("random", [rng.choice(words) for _ in range(4 + i % 5)]) for i in range(count)]
    return [replace(s, prompt=chat_prompt(subject.tokenizer, s.prompt))
            for s in task_samples(subject.tasks, per_task, tasks, seed)]


def scored(tasks: dict | None, samples: Sequence[Sample], texts: Sequence[str]) -> dict[str, float] | None:
    """Accuracy (%) per task and the mean over tasks; None without a task suite."""
    if tasks is None:
        return None
    by_task: dict[str, list[float]] = {}
    for sample, text in zip(samples, texts):
        by_task.setdefault(sample.task, []).append(tasks[sample.task].score(sample.example, text))
    out = {task: 100 * sum(v) / len(v) for task, v in by_task.items()}
    out["mean"] = statistics.fmean(out.values())
    return out


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
