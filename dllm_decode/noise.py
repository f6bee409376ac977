"""Uniform-noise canvases (DiffusionGemma): what an uncommitted column holds, the step schedule,
and the denoising of such canvases block by block.

On a masked canvas an uncommitted column holds [MASK] and a commit is final. On a noise canvas
(a model with `canvas_kind = "noise"`) every uncommitted column holds a uniformly random token,
redrawn every step: each step the decoder predicts the whole canvas, a rule (the request's
scheduler, through its usual `select`) accepts columns, accepted columns take the sampled token
and every other column is re-noised. A canvas ends when every row is stable and confident
(`NoiseSchedule`) or its step budget is spent; its ARGMAX is committed, encoded into the cache,
and the next canvas starts (transformers 5.24 `DiffusionGemmaForBlockDiffusion.generate`).

Random draws, in the reference's order, all from the request's generator: per canvas one
`randint(0, V, (B, C))`, then per step one `multinomial` over the (B*C, V) float32 softmax of
the tempered logits and one `randint(0, V, (B, C))` for the re-noise (drawn whole, then masked).
So `generate(..., generator=torch.Generator().manual_seed(s))` on the CPU draws exactly what the
reference draws after `torch.manual_seed(s)`. The batch runs as the reference runs it: every
row steps (and draws) until all rows of the canvas stop, so parity holds per batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig, DecodeResult
from dllm_decode.interfaces import NoCache, Scheduler

CANVAS_KINDS = ("mask", "noise")


@dataclass(frozen=True)
class NoiseCanvas:
    """An uncommitted column holds a uniform random token over `vocab_size` ids."""

    vocab_size: int

    def init(self, batch: int, width: int, generator: torch.Generator, device: Any) -> Tensor:
        return torch.randint(0, self.vocab_size, (batch, width), generator=generator, device=device)

    def refill(self, tokens: Tensor, keep: Tensor, generator: torch.Generator) -> Tensor:
        """`tokens` where `keep`, a fresh random token elsewhere (the whole draw is made)."""
        fresh = self.init(tokens.shape[0], tokens.shape[1], generator, tokens.device)
        return torch.where(keep, tokens, fresh)


@dataclass(frozen=True)
class NoiseSchedule:
    """How a noise canvas steps: `steps` at most, temperature `t_min + (t_max - t_min) * n /
    steps` with n the steps remaining (first step `t_max`), and a row stops once its argmax
    canvas equals each of the last `stability_threshold` ones and the mean entropy of its
    tempered logits is below `confidence_threshold` (the reference's defaults)."""

    steps: int = 48
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = 1
    confidence_threshold: float = 0.005

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        if not 0.0 <= self.t_min < self.t_max:
            raise ValueError(f"temperatures must satisfy 0 <= t_min < t_max, got t_min "
                             f"{self.t_min}, t_max {self.t_max}")
        if isinstance(self.stability_threshold, bool) or not isinstance(self.stability_threshold, int) \
                or self.stability_threshold < 0:
            raise ValueError(f"stability_threshold must be an integer >= 0, got {self.stability_threshold!r}")
        if not self.confidence_threshold > 0.0:
            raise ValueError(f"confidence_threshold must be > 0, got {self.confidence_threshold}")

    def temperature(self, remaining: int) -> Tensor:
        """The 0-d float32 temperature with `remaining` steps left (the reference's arithmetic)."""
        fraction = torch.tensor(remaining, dtype=torch.int32) / self.steps
        return self.t_min + (self.t_max - self.t_min) * fraction

    def stop(self, history: Tensor, argmax: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        """(B,) rows stable and confident now, and the argmax history with `argmax` appended."""
        if self.stability_threshold == 0:
            stable = torch.ones(argmax.shape[0], dtype=torch.bool, device=argmax.device)
        else:
            stable = (history == argmax[None]).all(-1).all(0)
            history = torch.cat([history[1:], argmax[None]])
        confident = token_entropy(logits).mean(-1) < self.confidence_threshold
        return stable & confident, history


def token_entropy(logits: Tensor) -> Tensor:
    """(B, C) entropy of each column's categorical (torch.distributions' formula, bit for bit
    the reference's, so sorts and threshold comparisons agree)."""
    return torch.distributions.Categorical(logits=logits, validate_args=False).entropy()


def canvas_kind(model: Any) -> str:
    """"noise" for a uniform-noise model, else "mask"."""
    return getattr(model, "canvas_kind", "mask")


def check_canvas(model: Any, config: DecodeConfig) -> None:
    """Raise a one-line ValueError when the request's scheduler does not run on the model's
    canvas kind, or (noise canvas) asks for what it does not have: a cache, filters, a flat
    temperature (the schedule sets its own), blocks other than the model's canvas."""
    kind, scheduler = canvas_kind(model), config.scheduler
    if kind not in scheduler.canvas_kinds:
        raise ValueError(f"scheduler {type(scheduler).__name__} does not run on a {kind} canvas "
                         f"(it runs on {list(scheduler.canvas_kinds)})")
    if kind != "noise":
        return
    if not isinstance(config.cache, NoCache):
        raise ValueError("a noise canvas reads its own encoder cache of committed canvases; use cache 'none'")
    if config.filters:
        raise ValueError("filters do not run on a noise canvas; pass none")
    if config.temperature != 0.0:
        raise ValueError("a noise canvas follows its schedule's temperatures (t_min, t_max); "
                         "leave temperature at 0")
    if config.block_length != model.canvas_length:
        raise ValueError(f"block_length must be the model's canvas_length {model.canvas_length}, "
                         f"got {config.block_length}")


def schedule_of(scheduler: Scheduler, model: Any) -> NoiseSchedule:
    """The scheduler's own schedule (`noise_schedule()`), else the model's shipped one."""
    own = getattr(scheduler, "noise_schedule", None)
    if callable(own):
        return own()
    shipped = getattr(model, "generation_defaults", {}) or {}
    names = {"max_denoising_steps": "steps", "t_min": "t_min", "t_max": "t_max",
             "stability_threshold": "stability_threshold", "confidence_threshold": "confidence_threshold"}
    return NoiseSchedule(**{names[k]: v for k, v in shipped.items() if k in names})


@torch.inference_mode()
def generate_noise(model: Any, prompts: Sequence[str] | Sequence[Sequence[int]], config: DecodeConfig, *,
                   generator: torch.Generator | None = None, tokenizer: Any = None,
                   trace: bool = False) -> DecodeResult:
    """Decode `prompts` on noise canvases of `model.canvas_length`, `gen_length / canvas_length`
    of them (see the module docstring). End of text: with `stop_at_eos` a row finishes on a
    canvas holding one of `model.eos_token_ids`; with a pad id (the generation config's) the
    tokens after its first EOS and every later canvas become pad. NFE per row: encoder passes
    plus the decoder passes it needed (steps while neither stopped nor finished). A step trace
    (`trace=True`) is refused: the masked loop's trace records commits, which a noise canvas
    does not make."""
    from dllm_decode.step import step_input

    check_canvas(model, config)
    if trace:
        raise ValueError("a noise canvas records no step trace; decode with trace=False")
    config.scheduler.check_fits(model.vocab_size, config.block_length)
    start = time.perf_counter()
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    ids = prompt_ids(model, prompts, config, tokenizer)
    device = model.model.decoder.embed_tokens.weight.device
    generator = generator if generator is not None else \
        torch.Generator(device=device).manual_seed(config.seed)
    batch, width = len(ids), max(len(row) for row in ids)
    prompt = torch.zeros(batch, width, dtype=torch.long, device=device)
    mask = torch.zeros(batch, width, dtype=torch.bool, device=device)
    for r, row in enumerate(ids):
        prompt[r, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[r, width - len(row):] = True
    scheduler, schedule = config.scheduler, schedule_of(config.scheduler, model)
    canvas, size, vocab = NoiseCanvas(model.vocab_size), model.canvas_length, model.vocab_size
    eos = torch.tensor(model.eos_token_ids if config.stop_at_eos else (), dtype=torch.long, device=device)
    pad = (getattr(model, "generation_defaults", {}) or {}).get("pad_token_id")
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    nfe = torch.zeros(batch, dtype=torch.long, device=device)
    out: list[Tensor] = []
    cache = None
    dtype = model.model.decoder.embed_tokens.weight.dtype
    for _ in range(config.gen_length // size):
        fresh = prompt if cache is None else out[-1]
        cache = model.encode(fresh, mask if cache is None else None, cache)
        nfe += ~finished
        x = canvas.init(batch, size, generator, device)
        argmax, sc = x, None
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        history = torch.full((schedule.stability_threshold, batch, size), -1, dtype=torch.long, device=device)
        state = scheduler.init_state(batch, device)
        for remaining in range(schedule.steps, 0, -1):
            nfe += ~(done | finished)
            z = model.denoise(x, cache, sc) / schedule.temperature(remaining).to(device)
            probs = torch.softmax(z, -1, dtype=torch.float32)
            sample = torch.multinomial(probs.view(-1, vocab), 1, generator=generator).view(batch, size)
            new_argmax = z.argmax(-1)
            inp = step_input(logits=z, probs=probs, candidates=sample, current=x,
                             is_masked=torch.ones_like(x, dtype=torch.bool),
                             step=schedule.steps - remaining, num_steps=schedule.steps,
                             generator=generator, eos_ids=tuple(model.eos_token_ids), mask_id=-1)
            decision, state = scheduler.select(inp, state)
            accept, tokens = decision.resolve(inp)
            new_x = canvas.refill(torch.where(accept, tokens, x), accept, generator)
            if bool(done.any()):          # a stopped row keeps its canvas, argmax and logits
                new_argmax = torch.where(done[:, None], argmax, new_argmax)
                new_x = torch.where(done[:, None], x, new_x)
                z = torch.where(done[:, None, None], sc, z)
            stopped, history = schedule.stop(history, new_argmax, z)
            done |= stopped
            x, argmax, sc = new_x, new_argmax, z.to(dtype)
            if bool(done.all()):
                break
        argmax, finished = finalize(argmax, finished, eos, pad)
        out.append(argmax)
        if bool(finished.all()):
            break
    return result_of(out, batch, config.gen_length, eos, pad, nfe, start, tokenizer)


def prompt_ids(model: Any, prompts: Any, config: DecodeConfig, tokenizer: Any) -> list[list[int]]:
    """The prompts as token-id lists, checked: not empty, ids inside the vocabulary, prompt plus
    generation inside the model's context. Raises a one-line ValueError (TypeError for a prompt
    that is neither text nor ids, or text without a tokenizer)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise TypeError("prompts must be a non-empty list of strings or of token-id lists")
    if any(isinstance(p, str) for p in prompts) and tokenizer is None:
        raise TypeError("text prompts need a tokenizer (the model has none); pass token ids")
    ids = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    for row in ids:
        if not row:
            raise ValueError("the prompt is empty; give at least one token")
        if any(isinstance(t, bool) or not isinstance(t, int) for t in row):
            raise TypeError("token ids must be integers")
        if min(row) < 0 or max(row) >= model.vocab_size:
            raise ValueError(f"token id {max(row) if max(row) >= model.vocab_size else min(row)} is "
                             f"outside the vocabulary [0, {model.vocab_size})")
    longest = max(len(row) for row in ids) + config.gen_length
    if model.max_length is not None and longest > model.max_length:
        raise ValueError(f"prompt plus generation ({longest} tokens) exceeds the model's context "
                         f"({model.max_length})")
    return ids


def finalize(block: Tensor, finished: Tensor, eos: Tensor, pad: int | None) -> tuple[Tensor, Tensor]:
    """The committed canvas after the reference's end-of-text rules, and the rows now finished."""
    is_eos = torch.isin(block, eos)
    now = finished | is_eos.any(-1)
    if pad is not None and bool(now.any()):
        seen = is_eos.cumsum(-1)
        after = (seen > 0) & ~((seen == 1) & is_eos)
        block = block.masked_fill(after & (now & ~finished)[:, None], pad)
        block = block.masked_fill(finished[:, None], pad)
    return block, now


def result_of(blocks: list[Tensor], batch: int, gen_length: int, eos: Tensor, pad: int | None,
              nfe: Tensor, start: float, tokenizer: Any) -> DecodeResult:
    """The `DecodeResult`: canvases never decoded (every row finished) are end-of-text filled."""
    tokens = torch.cat(blocks, 1)
    fill = pad if pad is not None else (int(eos[0]) if eos.numel() else 0)
    if tokens.shape[1] < gen_length:
        rest = torch.full((batch, gen_length - tokens.shape[1]), fill, dtype=torch.long, device=tokens.device)
        tokens = torch.cat([tokens, rest], 1)
    is_eos = torch.isin(tokens, eos)
    lengths = torch.where(is_eos.any(-1), is_eos.int().argmax(-1), tokens.shape[1])
    text = None
    if tokenizer is not None:
        text = [tokenizer.decode(row[:n].tolist()) for row, n in zip(tokens.cpu(), lengths.tolist())]
    return DecodeResult(tokens=tokens.cpu(), nfe=nfe.cpu(), answer_lengths=lengths.cpu(),
                        seconds=time.perf_counter() - start, text=text)
