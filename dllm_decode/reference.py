"""The reference loop: one request, no cache, no batch, every step in plain locals (LLaDA's loop).

The executable specification of `generate` for a scheduler that never takes a token back:
the prompt, then G masks, decoded block by block from left to right; each step one full forward,
the scheduler's view from `dllm_decode.step`, its decision under the loop's rules, and the
commits written. The tests check that `generate` equals it token for token over the registry.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig
from dllm_decode.consult import Consultant
from dllm_decode.devices import device_of
from dllm_decode.interfaces import DiffusionLM, NoCache
from dllm_decode.prompts import encode_prompts
from dllm_decode.step import draws_past_block, propose, resolve, step_input, write


@torch.inference_mode()
def reference_generate(model: DiffusionLM, prompt: Sequence[int], config: DecodeConfig,
                       generator: torch.Generator | None = None) -> Tensor:
    """(G,) tokens `generate(model, [prompt], config, generator=generator)` must produce.

    Raises:
        ValueError: filters, a cache, or a scheduler that revises (the reference has none).
    """
    scheduler, mask, eos = config.scheduler, model.mask_token_id, tuple(model.eos_token_ids)
    if config.filters or not isinstance(config.cache, NoCache) or scheduler.revises != "none":
        raise ValueError("the reference loop runs a commit-only scheduler, no filters, no cache")
    (prompt,) = encode_prompts([list(prompt)], None, model.vocab_size, mask)
    device = device_of(model)
    generator = generator or torch.Generator(device=device).manual_seed(config.seed)
    x = torch.tensor([[*prompt] + [mask] * config.gen_length], device=device)
    gen_start, length = len(prompt), x.shape[1]
    wide = scheduler.view == "rest"            # the rule looks past its block: logits to the end
    past = draws_past_block(config)            # its sampling draws run to the end too
    state = scheduler.init_state(1, device)
    memory: dict = {}                          # the extra forwards' per-request memory
    attend, gen_end = None, length             # a truncation shrinks both (EoTP-style rules)
    start = gen_start
    while start < length:
        end, step = min(start + config.block_length, length), 0
        while bool((x[:, start:end] == mask).any()):
            logits = model(x, attend, rows=(start, length))[:, :None if wide else end - start]
            current = x[:, start:start + logits.shape[1]].clone()

            def view(proposal: tuple, end: int, budget: int):
                logits, probs, candidates, *noise = proposal
                return step_input(logits=logits, probs=probs, candidates=candidates,
                                  current=current, block=torch.tensor([[start, end]], device=device),
                                  gen_span=torch.tensor([[gen_start, gen_end]], device=device),
                                  offset=start, step=step, num_steps=budget, generator=generator,
                                  eos_ids=eos, mask_id=mask, noise=noise[0] if noise else None)

            def proposed(logits: Tensor):         # noise drawn for start..end (or ..the end), truncation kept
                region = (torch.tensor([start], device=device), (gen_end if past else min(end, gen_end)) - start, start)
                return propose(logits, mask, config.temperature, generator, region,
                               noise=scheduler.needs_noise)

            inp = view(proposed(logits), end, end - start)
            processed, state = scheduler.process_logits(inp, state)
            if processed is not None:
                inp = view(proposed(processed), end, inp.num_steps)
            if step == 0:
                ends, state = scheduler.block_end(inp, state)
                if ends is not None:
                    end = max(start + 1, min(int(ends[0]), length))
                    inp = view((inp.logits, inp.probs, inp.candidates, inp.noise), end, end - start)
            if scheduler.lookahead_candidates or scheduler.guide:   # the rule's extra forwards
                inp, state = Consultant(model, x.clone(), attend, memory)(scheduler, inp, state)
            decision, state = scheduler.select(inp, state)
            budgeted = scheduler.step_budget(inp.num_steps) is not None
            x[:, start:start + current.shape[1]] = write(current, resolve(inp, decision, budgeted=budgeted), mask)
            if decision.truncate_at is not None and int(decision.truncate_at[0]) < gen_end:
                gen_end = max(int(decision.truncate_at[0]), gen_start)   # the rest: end-of-text, unseen
                x[:, gen_end:] = eos[0]
                attend = (torch.arange(length, device=device) < gen_end).long().unsqueeze(0)
            step += 1
        if config.stop_at_eos and bool(torch.isin(x[:, start:end], torch.tensor(eos, device=device)).any()):
            x[:, end:] = eos[0]                 # an answer that ended: the rest is end-of-text
            break
        start = end
    return x[0, gen_start:].cpu()
