"""Which repository files one Decoding.step() executes (eager / captured forward with the decision on the host / captured whole step), for a dual-cache LLaDA step: `python measurements/loop_refactor/step_files.py $(pwd)`."""
import sys, os
import torch
from dllm_decode.caches import CACHES
from dllm_decode.config import DecodeConfig
from dllm_decode.sampler import Decoding
from dllm_decode.schedulers import SCHEDULERS, ThresholdScheduler
from dllm_decode.capture import GraphCache
from dllm_decode.testing import tiny_llada
root = sys.argv[1]
model = tiny_llada(layers=2)
class HostRule(ThresholdScheduler):
    capturable = False
def files(capture, rule):
    cfg = DecodeConfig(scheduler=rule, cache=CACHES["dual"](), gen_length=16, block_length=4)
    d = Decoding(model, cfg.cache, capture=capture)
    d.add([[5, 6, 7]], cfg)
    d.step(); d.step()                      # the refresh, then a cached step (warm)
    seen = set()
    def tracer(frame, event, arg):
        f = frame.f_code.co_filename
        if f.startswith(root) and "/.venv/" not in f:
            seen.add(os.path.relpath(f, root))
        return None
    sys.setprofile(lambda frame, event, arg: tracer(frame, event, arg) if event == "call" else None)
    with torch.inference_mode():
        d.step()
    sys.setprofile(None)
    return sorted(seen)
for name, capture, rule in (("eager", "off", ThresholdScheduler()), ("captured forward, host decision", GraphCache("static"), HostRule()),
                            ("captured whole step", GraphCache("static"), ThresholdScheduler())):
    fs = files(capture, rule)
    print(f"{name}: {len(fs)} files: {', '.join(fs)}")
