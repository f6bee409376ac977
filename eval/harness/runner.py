"""`evaluate`: run a grid of decoding settings over scored tasks, resumably and data-parallel.

Work is cut into batches once, from the whole grid (setting x task x canvas length, in order),
so a batch's rows and its random generator (seeded from the batch's identity) do not depend on
how many processes share the work or on what an earlier run finished: batch b goes to rank
b mod world. Each finished batch is appended to JSONL at once (`dllm_decode.eval.harness.records`); a re-run skips
samples already written. With several processes each rank writes `samples.rank<r>.jsonl` and rank
0 merges them into `samples.jsonl`, then writes `summary.json`, `report.md` and the plots.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dllm_decode.capture import graph_cache
from dllm_decode.config import DecodeConfig
from dllm_decode.modelspec import ModelSpec, load_diffusion
from dllm_decode.noise import canvas_kind
from dllm_decode.prompts import chat_prompt
from dllm_decode.sampler import generate
from dllm_decode.eval.harness import distributed
from dllm_decode.eval.harness.grid import Setting
from dllm_decode.eval.harness.progress import Progress
from dllm_decode.eval.harness.records import (SAMPLES, append_records, read_records, repair,
                                              sample_key, stable_hash, unique_by_key)
from dllm_decode.eval.tasks import Example
from dllm_decode.eval.tasks.sources import TaskRun
from dllm_decode.schedulers.adaptive_block import with_delimiters

__all__ = ["SAMPLES", "Batch", "Decoder", "ar_decoder", "check_settings", "decoder_for", "diffusion_decoder",
           "evaluate", "generate_rows", "ideal_decoder", "plan", "self_decoded_rows"]


@dataclass(frozen=True)
class Batch:
    """Rows decoded together: one setting, one task, one canvas length."""

    setting: Setting
    config_key: str
    run: TaskRun
    gen_length: int
    indices: tuple[int, ...]

    @property
    def seed(self) -> int:
        return int(stable_hash([self.config_key, self.run.name, self.indices[0]], 15), 16)


Decoder = Callable[[list[str], Setting, int, torch.Generator], tuple[list[dict[str, Any]], float]]
"""(prompts, setting, gen_length, generator) -> (per row: output, nfe, tokens_per_step,
answer_tokens_per_step; seconds for the batch)."""


def decoder_for(spec: ModelSpec, device: Any = None, dtype: Any = None,
                chat_template: bool = True, trust_remote_code: bool = False,
                runtime: str | None = None, tensor_parallel: int | None = None,
                capture: str = "off", adapter: Sequence[str] = (), quantize: str | None = None,
                attention: str | None = None, kv_cache_dtype: str = "auto") -> tuple[Decoder, Any]:
    """The decoder and tokenizer a model name stands for: the one denoising loop for a diffusion
    LM (or `tiny`), the ideal model built per canvas length, or the AR (speculative) baseline.
    `trust_remote_code` lets a checkpoint run its own tokenizer/model code (off by default);
    `runtime` is the diffusion model's (`load_model`; the AR baseline names its own, `@compact`);
    `tensor_parallel` shards a diffusion model over this process's TP group (`load_model`);
    `capture` is the diffusion decodes' step runtime (`generate`'s; one `GraphCache` for the run);
    `adapter`: PEFT LoRA folders merged into a diffusion model at load (`load_model`).
    `quantize` quantizes a diffusion model's linear layers on load (`load_model`);
    `kv_cache_dtype` is its K/V store (`dllm_decode.quant.kv`).
    `attention` is a diffusion model's attention back end (`load_model`).

    Raises:
        ValueError: the model cannot be loaded (`ModelLoadError`) or its options are bad; a
            capture mode for the AR baseline.
    """
    if runtime == "compact" and spec.kind in ("ideal", "ar"):
        raise ValueError(f"--runtime compact applies to the plain-torch diffusion models, not to "
                         f"{str(spec)!r}" + (" (use `@compact` on the AR target)" if spec.kind == "ar" else ""))
    if adapter and spec.kind not in ("diffusion", "tiny"):
        raise ValueError(f"LoRA adapters apply to diffusion LMs, not to {str(spec)!r}")
    if (tensor_parallel or 1) > 1 and spec.kind not in ("diffusion", "tiny"):
        raise ValueError(f"--tensor-parallel shards a diffusion LM checkpoint, not {str(spec)!r}")
    if quantize is not None and spec.kind not in ("diffusion", "tiny"):
        raise ValueError(f"--quantize applies to a diffusion LM checkpoint, not {str(spec)!r}")
    if attention is not None and spec.kind not in ("diffusion", "tiny"):
        raise ValueError(f"--attention applies to a diffusion LM checkpoint, not {str(spec)!r}")
    if kv_cache_dtype != "auto" and spec.kind not in ("diffusion", "tiny"):
        raise ValueError(f"--kv-cache-dtype applies to a diffusion LM checkpoint, not {str(spec)!r}")
    if capture != "off" and spec.kind == "ar":
        raise ValueError(f"capture {capture!r} runs a diffusion model's step; {str(spec)!r} is "
                         f"the AR baseline (use capture 'off')")
    if spec.kind == "ideal":
        from dllm_decode.eval.tasks.tokenizer import load_tokenizer
        from dllm_decode.eval.theory.ideal import ideal_options

        return ideal_decoder(**ideal_options(dict(spec.options)), capture=capture), load_tokenizer()
    if spec.kind == "ar":
        from dllm_decode.speculative import DraftContext, make_drafter, with_runtime
        from dllm_decode.models.causal import load_causal_lm

        target = load_causal_lm(spec.name, device=device, trust_remote_code=trust_remote_code)
        drafter, _ = make_drafter(spec.draft or "none", DraftContext(target, device))
        return ar_decoder(with_runtime(target, spec.runtime), drafter, chat_template=chat_template), \
            target.tokenizer
    model = load_diffusion(spec, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                           runtime=runtime, tensor_parallel=tensor_parallel, adapter=list(adapter) or None,
                           quantize=quantize, attention=attention)
    from dllm_decode.quant.kv import set_kv_cache_dtype

    set_kv_cache_dtype(model, kv_cache_dtype)
    return diffusion_decoder(model, chat_template, capture), getattr(model, "tokenizer", None)


def diffusion_decoder(model: Any, chat_template: bool = True, capture: str = "off") -> Decoder:
    """Decode with the one denoising loop; prompts go through the tokenizer's chat template
    when it has one (instruction-tuned checkpoints) and `chat_template` is set. `capture`
    (`generate`'s) runs every batch through one `GraphCache`, so each bucket's graph is compiled
    or recorded once per run."""
    tokenizer = getattr(model, "tokenizer", None)
    capture = graph_cache(capture) or "off"

    own = getattr(model, "block_size", None) or getattr(model, "canvas_length", None)   # a noise canvas

    def decode(prompts: list[str], setting: Setting, gen_length: int,
               generator: torch.Generator) -> tuple[list[dict[str, Any]], float]:
        prompts = [chat_prompt(tokenizer, p, chat_template) for p in prompts]
        config = setting.decode_config(setting.canvas_for(gen_length, own), own)
        selfdec = setting.build_self_decoder()
        if selfdec is not None:
            return self_decoded_rows(model, selfdec, prompts, config, generator, tokenizer)
        return generate_rows(model, prompts, config, generator, tokenizer, capture)

    def check(setting: Setting, gen_length: int) -> None:
        """Raise the one-line ValueError a setting's self-decoder gives for this model, before
        any decode (`SelfDecoder.check`; loop settings pass), or for a capture mode beside it."""
        selfdec = setting.build_self_decoder()
        if selfdec is None:
            return
        if capture != "off":
            raise ValueError("a self-decoder runs its own rounds, which capture does not record; "
                             "drop --cuda-graphs / --compile (or --self-decoder)")
        selfdec.check(model, setting.decode_config(setting.canvas_for(gen_length, own), own))

    decode.check = check                      # type: ignore[attr-defined]
    decode.model = model                      # type: ignore[attr-defined]  # probed by the tuner
    decode.grid = own                         # type: ignore[attr-defined]  # answer canvases round to it
    return decode


def check_settings(decoder: Decoder, settings: Sequence[Setting]) -> None:
    """Raise a one-line ValueError for a setting the decoder refuses before any decode: a
    self-decoder the model or record does not fit (the diffusion decoder's `check`), or any
    self-decoder on a decoder without one (the ideal model, the AR baseline)."""
    check = getattr(decoder, "check", None)
    for setting in settings:
        if check is not None:
            check(setting, setting.gen_length or 32)
        elif setting.self_decoder != "none":
            raise ValueError(f"self-decoder {setting.self_decoder!r} runs on a diffusion LM checkpoint "
                             f"(block-diffusion families); this model has no self-decoding")


def self_decoded_rows(model: Any, decoder: Any, prompts: list[str], config: DecodeConfig,
                      generator: torch.Generator, tokenizer: Any) -> tuple[list[dict[str, Any]], float]:
    """One `SelfDecoder.decode` call: the rows `generate_rows` gives (NFE counts verification
    forwards), plus each row's verification forwards and the decoder's record."""
    from dllm_decode.registry import component_dict

    config = dataclasses.replace(config, scheduler=with_delimiters(config.scheduler, tokenizer))
    out = decoder.decode(model, prompts, config, generator=generator, tokenizer=tokenizer)
    result = out.result
    texts = result.text or [" ".join(map(str, row.tolist())) for row in result.tokens]
    used, own = config.to_dict(), component_dict(decoder)
    rows = [{"output": text, "nfe": int(nfe), "tokens_per_step": float(tps),
             "answer_tokens_per_step": float(atps), "block_length": config.block_length,
             "forward_rows": int(frows), "guide_nfe": 0, "verifies": int(verifies),
             "decode_config": used, "self_decoder": own}
            for text, nfe, tps, atps, frows, verifies in zip(
                texts, result.nfe.tolist(), result.tokens_per_step.tolist(),
                result.answer_tokens_per_step.tolist(), result.forward_rows.tolist(), out.verifies.tolist())]
    return rows, result.seconds


def ideal_decoder(noise: float = 1e-3, capture: str = "off") -> Decoder:
    """Decode with ParallelBench's ideal model (`dllm_decode.eval.theory.ideal.IdealModel`, built
    per canvas length).

    Args:
        noise: std of the zero-mean logit noise (l_ideal + eps); a small value breaks the exact ties
            of uniform marginals at random, as the closed forms for greedy decoding assume. Its
            generator is drawn from the batch's, so runs repeat.
        capture: `generate`'s step runtime (one `GraphCache` for the run).
    """
    from dllm_decode.eval.theory.ideal import ideal_model

    capture = graph_cache(capture) or "off"

    def decode(prompts: list[str], setting: Setting, gen_length: int,
               generator: torch.Generator) -> tuple[list[dict[str, Any]], float]:
        seed = int(torch.randint(2 ** 62, (1,), generator=generator))
        model = ideal_model(gen_length, {"noise": str(noise)}, torch.Generator().manual_seed(seed))
        return generate_rows(model, prompts, setting.decode_config(gen_length), generator,
                             model.tokenizer, capture)
    return decode


def ar_decoder(target: Any, drafter: Any = None, max_draft: int = 8,
               chat_template: bool = True) -> Decoder:
    """The AR baseline: `dllm_decode.speculative` (target verifies `drafter`'s proposals; plain AR
    without one), the setting's scheduler choosing each round's draft length. Batch size 1 per
    call. NFE counts target forwards. `answer_tokens_per_step` is the answer tokens (up to the
    first end-of-text, as for a dLLM) per target forward, the unit dLLM points are drawn in;
    `tokens_per_step` counts every appended token, the end-of-text included (Spec-Bench's mean
    accepted tokens)."""
    from dllm_decode.speculative import Sampling, SpecConfig, eos_ids_of, speculative_generate

    tokenizer = getattr(target, "tokenizer", None)
    eos = set(eos_ids_of(target, tokenizer))

    def decode(prompts: list[str], setting: Setting, gen_length: int,
               generator: torch.Generator) -> tuple[list[dict[str, Any]], float]:
        config = SpecConfig(scheduler=setting.decode_config(gen_length).scheduler,
                            max_new_tokens=gen_length, max_draft=max_draft,
                            sampling=Sampling(temperature=setting.temperature))
        rows, seconds = [], 0.0
        for prompt in prompts:
            result = speculative_generate(target, chat_prompt(tokenizer, prompt, chat_template), config,
                                          drafter, generator=generator)
            tokens = result.tokens.tolist()
            answer = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
            forwards = max(1, result.target_forwards)
            rows.append({"output": result.text if result.text is not None else
                         " ".join(map(str, tokens)),
                         "nfe": result.target_forwards, "tokens_per_step": len(tokens) / forwards,
                         "answer_tokens_per_step": answer / forwards,
                         "draft_forwards": result.draft_forwards})
            seconds += result.seconds
        return rows, seconds
    return decode


def generate_rows(model: Any, prompts: list[str], config: DecodeConfig, generator: torch.Generator,
                  tokenizer: Any, capture: Any = "off") -> tuple[list[dict[str, Any]], float]:
    """One `generate` call (`capture`: its step runtime): per row the text and speed figures,
    and the seconds."""
    # AdaBlock's delimiters are tokenizer ids: fill an empty `delimiter_ids` as the CLI does.
    config = dataclasses.replace(config, scheduler=with_delimiters(config.scheduler, tokenizer))
    # the generation order is read from the step trace, which a captured step does not record
    # (nor a uniform-noise canvas, whose every column is rewritten each step)
    traced = isinstance(capture, str) and capture == "off" and canvas_kind(model) == "mask"
    result = generate(model, prompts, config, generator=generator, tokenizer=tokenizer, capture=capture,
                      trace=traced)
    texts = result.text or [" ".join(map(str, row.tolist())) for row in result.tokens]
    used = config.to_dict()                  # the exact record each sample was decoded under
    rows = [{"output": text, "nfe": int(nfe), "tokens_per_step": float(tps),
             "answer_tokens_per_step": float(atps), "block_length": config.block_length,
             "forward_rows": int(frows), "guide_nfe": int(gnfe), "decode_config": used}
            for text, nfe, tps, atps, frows, gnfe in zip(
                texts, result.nfe.tolist(), result.tokens_per_step.tolist(),
                result.answer_tokens_per_step.tolist(), result.forward_rows.tolist(),
                result.guide_nfe.tolist())]
    if traced:
        add_order(rows, result)
    return rows, result.seconds


def add_order(rows: list[dict[str, Any]], result: Any) -> None:
    """Each row's generation order (arXiv 2601.15593's AFP and Kendall's tau, and the step that
    finalised each canvas position, for the decode-order heatmap), from the result's trace."""
    from dllm_decode.viz.order import finalization_steps, order_stats

    steps = finalization_steps(result).tolist()
    for row, finalized, answer in zip(rows, steps, result.answer_lengths.tolist()):
        stats = order_stats(finalized, int(answer))
        row.update(afp=stats.afp, kendall_tau=stats.kendall_tau, finalized_at=finalized)


def answer_length(tokenizer: Any, example: Example) -> int:
    """Tokens of the reference answer under the model's tokenizer (words without one)."""
    if tokenizer is None:
        return max(1, len(example.answer.split()))
    return max(1, len(tokenizer(example.answer, add_special_tokens=False)["input_ids"]))


def plan(settings: Sequence[Setting], runs: Sequence[TaskRun], tokenizer: Any, model_name: str,
         batch_size: int, grid: int | None = None) -> list[Batch]:
    """All batches of the grid, in a fixed order (`grid`: the model's own block, to which
    answer-length canvases are rounded up: `Setting.canvas_for`)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batches = []
    lengths: dict[tuple[str, int], int] = {}
    for setting in settings:
        config_key = config_key_of(setting, model_name)
        for run in runs:
            by_length: dict[int, list[int]] = {}
            for i, example in enumerate(run.examples):
                if setting.gen_length is None:
                    length = lengths.setdefault((run.name, i), answer_length(tokenizer, example))
                    block, canvas = setting.block_length, setting.canvas_for(length, grid)
                    if block is not None and (block > canvas or canvas % block):
                        raise ValueError(f"block_length {block} does not fit the answer-length "
                                         f"canvas of {canvas} tokens ({run.name} example {i}); with "
                                         f"gen_length 'answer' leave the block length out (one block "
                                         f"per canvas) or give one that divides every answer length")
                else:
                    length = setting.gen_length
                by_length.setdefault(length, []).append(i)
            for length, indices in by_length.items():
                for start in range(0, len(indices), batch_size):
                    batches.append(Batch(setting, config_key, run, length,
                                         tuple(indices[start:start + batch_size])))
    return batches


def config_key_of(setting: Setting, model_name: str) -> str:
    return stable_hash({"model": model_name, **setting.to_dict()})


def evaluate(decoder: Decoder, model_name: str, settings: Sequence[Setting],
             runs: Sequence[TaskRun], out_dir: str | Path, *, tokenizer: Any = None,
             batch_size: int = 8, progress: bool = False,
             identity: dict[str, Any] | None = None) -> list[dict[str, Any]] | None:
    """Decode and score every pending sample of the grid; resumes from `out_dir`.

    Args:
        decoder: how a batch is decoded (`diffusion_decoder(model)`, `ideal_decoder()`).
        model_name: recorded in every sample and part of the configuration key.
        settings: the grid (`dllm_decode.eval.harness.grid.expand_grid`).
        runs: the tasks (`dllm_decode.eval.tasks.sources.select_tasks`).
        out_dir: where `samples.jsonl` (and the rank shards) live.
        tokenizer: counts answer tokens for `gen_length=answer` canvases (None: words).
        batch_size: rows per decoder call.
        progress: draw a progress bar on stderr (rank 0 only).
        identity: the model's identity (`dllm_decode.runkey.model_identity`), recorded in
            `run.json`; resuming a folder written with another model is a ValueError naming it
            (the grid's settings are part of every sample's key, so new settings add samples).
    Returns:
        On rank 0 the grid's records, in plan order; None on the other ranks.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rank, world = distributed.rank_and_world()
    with exclusive(out, rank) if distributed.writes() else contextlib.nullcontext():
        if identity is not None and rank == 0 and distributed.writes():
            same_model(out, identity)
        return _evaluate(decoder, model_name, settings, runs, out, tokenizer, batch_size, progress,
                         rank, world)


def _evaluate(decoder: Decoder, model_name: str, settings: Sequence[Setting], runs: Sequence[TaskRun],
              out: Path, tokenizer: Any, batch_size: int, progress: bool, rank: int,
              world: int) -> list[dict[str, Any]] | None:
    mine = out / (SAMPLES if world == 1 else f"samples.rank{rank}.jsonl")
    writer = distributed.writes()   # under TP: rank 0 of each TP group; the others decode only
    if rank == 0 and writer:        # shards left by a killed run (of any world size) come first
        distributed.merge_shards(out, SAMPLES)
    distributed.barrier()
    grid = getattr(decoder, "grid", None)
    batches = [b for i, b in enumerate(plan(settings, runs, tokenizer, model_name, batch_size, grid))
               if i % world == rank]
    todo: list[list[int]] | None = None
    if writer:
        repair(mine)
        done = {r["key"] for r in read_records(out / SAMPLES)} | {r["key"] for r in read_records(mine)}
        todo = [[i for i in b.indices if _key(b, i) not in done] for b in batches]
    todo = distributed.from_group_leader(todo)       # the TP group decodes the same rows
    pending = [(b, rows) for b, rows in zip(batches, todo) if rows]
    bar = Progress(sum(len(rows) for _, rows in pending), label=f"eval {model_name}",
                   enabled=progress and rank == 0 and writer)
    for batch, rows in pending:
        records = _decode(batch, rows, decoder, model_name)
        if writer:
            append_records(mine, records)
        bar.update([r["score"] for r in records])
    bar.close()
    distributed.barrier()
    if rank != 0 or not writer:
        return None
    if world > 1:
        distributed.merge_shards(out, SAMPLES)
    keys = [_key(b, i) for b in plan(settings, runs, tokenizer, model_name, batch_size, grid) for i in b.indices]
    by_key = {r["key"]: r for r in unique_by_key(read_records(out / SAMPLES))}
    return [by_key[k] for k in keys if k in by_key]


RUN_FILE = "run.json"


def same_model(out: Path, identity: dict[str, Any]) -> None:
    """Record the identity of each model an evaluation folder holds samples of (`run.json`, by
    model name: a folder may hold several models, `--combine`), or refuse to resume samples of a
    model name whose checkpoint has changed since (its config or weight files differ).

    Raises:
        ValueError: naming the model and what changed.
    """
    import json

    from dllm_decode.outputs import atomic_write
    from dllm_decode.runkey import check_resume

    path = out / RUN_FILE
    models: dict[str, Any] = {}
    if path.is_file():
        try:
            models = json.loads(path.read_text(encoding="utf-8"))["models"]
            if not isinstance(models, dict):
                raise ValueError
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            raise ValueError(f"{path} is not this tool's run record; move it away or choose another --out") from None
    name = identity.get("name")
    if name in models:
        check_resume({"model": models[name]}, {"model": identity}, f"the folder {str(out)!r}",
                     "choose another --out")
        return
    atomic_write(path, json.dumps({"models": {**models, name: identity}}, sort_keys=True) + "\n", "run record")


@contextlib.contextmanager
def exclusive(out: Path, rank: int) -> Iterator[None]:
    """Hold `out`'s writer lock for this rank while the evaluation runs (released by the OS if the
    process dies), so a second evaluation of the same directory fails at once instead of
    appending every sample twice.

    Raises:
        ValueError: another process holds the lock (the message names its pid).
    """
    from dllm_decode.outputs import output_lock

    with output_lock(out, "output folder", lock=out / f".lock.rank{rank}", holder="evaluation",
                     hint="wait for it to finish or choose another --out"):
        yield


def _key(batch: Batch, index: int) -> str:
    return sample_key(batch.config_key, batch.run.name, index, batch.run.examples[index].prompt)


def _decode(batch: Batch, rows: list[int], decoder: Decoder, model_name: str) -> list[dict[str, Any]]:
    examples = [batch.run.examples[i] for i in rows]
    generator = torch.Generator().manual_seed(batch.seed)
    started = time.perf_counter()
    outputs, seconds = decoder([e.prompt for e in examples], batch.setting, batch.gen_length,
                               generator)
    seconds = seconds or time.perf_counter() - started
    setting = batch.setting
    records = []
    for i, example, out in zip(rows, examples, outputs):
        items = example.meta.get("items")
        records.append({
            "key": _key(batch, i), "config_key": batch.config_key, "group": setting.group,
            "task": batch.run.name, "index": i, "model": model_name,
            "scheduler": setting.scheduler, "params": setting.params(), "label": setting.label(),
            "swept": list(setting.swept), "config": setting.to_dict(),
            "prompt": example.prompt, "reference": example.answer,
            "score": float(batch.run.score(example, out["output"])),
            "gen_length": batch.gen_length, "block_length": setting.block_for(batch.gen_length),
            "n": len(items) if isinstance(items, list) else None,
            "seconds": seconds / len(rows), **out,
        })
    return records
