"""The one loop alone (`Decoding`, no server), with and without the prefix cache, on
`embedded-noise` at a fixed answer length: its shipped decoding with `stop_at_eos=False`, so
every request denoises all 4 canvases of gen 32 (the shipped model answers these long prompts
with end of text at once, and the engine ends a request at its end of text, so the server
workload decodes one canvas per request). 64 requests sharing a 256-token system prompt (as the
shared-prefix workload: 48 single-turn, 8 chats' two turns, the second carrying the first
turn's prompt), at most 8 decoding at once (a new one joins as one finishes), the prefix cache
hooked as the engine hooks it (`PrefixSharing.hook`); 3 alternating off/on pairs in one process.
Prints requests/s per phase, the on/off ratios and whether every request's tokens are identical
off and on.

    OMP_NUM_THREADS=1 nice -n 10 python engine_fixed_length.py > engine_fixed_length.json
"""

from __future__ import annotations

import dataclasses
import json
import time

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.eval.bench.subject import task_samples
from dllm_decode.eval.tasks import TASKS
from dllm_decode.models.loading import load_model
from dllm_decode.prefix_reuse import PrefixSharing
from dllm_decode.sampler import Decoding

torch.set_num_threads(1)
model = load_model("embedded-noise")
tokenizer = model.tokenizer
config = dataclasses.replace(DecodeConfig.for_model(model, 32), stop_at_eos=False)
ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]   # noqa: E731
questions = iter(s.prompt for s in task_samples(TASKS, 40, seed=0))
system: list[int] = []
while len(system) < 256:
    system += ids(next(questions) + " ;")
system = system[:256]
prompts = [system + ids(" " + next(questions)) for _ in range(56)]
prompts += [p + ids(" ; " + next(questions)) for p in prompts[48:]]       # the chats' second turns


def phase(budget: int) -> tuple[float, dict[int, list[int]], dict]:
    decoding = Decoding(model, config.cache)
    sharing = PrefixSharing(budget) if budget else None
    decoding.reuse = None if sharing is None else sharing.hook(model, config.cache)
    started = time.perf_counter()
    waiting, running, out = list(enumerate(prompts)), 0, {}
    while waiting or running:
        while waiting and running < 8:
            key, p = waiting.pop(0)
            decoding.add([p], config, key=key)
            running += 1
        for key in decoding.step():
            out[key] = decoding.result(key).tokens[0].tolist()
            running -= 1
    seconds = time.perf_counter() - started
    return len(prompts) / seconds, out, ({} if sharing is None else sharing.stats().to_dict())
report = {"requests": len(prompts), "mean_prompt": sum(map(len, prompts)) / len(prompts),
          "gen_length": 32, "max_batch": 8, "phases": []}
tokens = {}
for pair in range(3):
    for mode in (("off", "on") if pair % 2 == 0 else ("on", "off")):
        rate, out, stats = phase(64 << 20 if mode == "on" else 0)
        tokens.setdefault(mode, []).append(out)
        report["phases"].append({"pair": pair, "prefix_cache": mode, "requests_per_second": round(rate, 3),
                                 "answer_tokens": sum(map(len, out.values())), "store": stats})
rate = {(p["pair"], p["prefix_cache"]): p["requests_per_second"] for p in report["phases"]}
report["speedup"] = [round(rate[(i, "on")] / rate[(i, "off")], 3) for i in range(3)]
report["identical"] = all(t == tokens["off"][0] for t in tokens["off"] + tokens["on"])
print(json.dumps(report, indent=1))
