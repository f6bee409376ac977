"""timing.md: the embedded model's forward at long synthetic prompts, dense attention beside
SparseD (the paper's defaults: tile 128, select 0.3) after its switch step, side by side, and
what that makes of a whole decode of T steps (E = int(0.2 T) + 1 dense forwards, one build,
the rest sparse).

Per prompt length: the median over interleaved repeats of the process CPU time (one thread) of a
whole forward and of the attention calls inside it (dense: SDPA; sparse: `SparseState.attend`,
the expanded tile mask plus SDPA under it), and the one-off pattern build forward. Prompts are
random token ids; the generation is 32 [MASK] columns. Canvases past the model's 1024 positions
(rotary, so computable) time the compute only: their logits mean nothing. Run from the repository root:
OMP_NUM_THREADS=1 python measurements/cpu_2026-11-29-sparsed/timing.py
"""

import statistics
import time

import torch

from dllm_decode.interfaces import NoCache
from dllm_decode.models import compact, sparsed
from dllm_decode.models.attention import set_attention
from dllm_decode.models.loading import load_model

REPEATS = 7
GEN = 32
spent = {"attention": 0.0}


def timed(fn):
    def wrapper(*args, **kwargs):
        start = time.process_time()
        out = fn(*args, **kwargs)
        spent["attention"] += time.process_time() - start
        return out
    return wrapper


compact.sdpa = timed(compact.sdpa)                   # the dense forward's attention calls
sparsed.SparseState.attend = timed(sparsed.SparseState.attend)


def measure(call):
    spent["attention"] = 0.0
    start = time.process_time()
    call()
    return time.process_time() - start, spent["attention"]


def decode(steps: int, dense: float, sparse: float, build: float) -> float:
    """A whole T-step decode with SparseD's defaults (skip 0.2: E dense forwards, one build
    forward, the rest sparse) over T dense forwards, from the measured forward times."""
    switch = int(steps * 0.2) + 1
    return (switch * dense + build + (steps - switch - 1) * sparse) / (steps * dense)


def main() -> None:
    torch.manual_seed(0)
    model = load_model("embedded")
    mask_id = model.mask_token_id
    print("| prompt | canvas | dense forward ms | sparse forward ms | sparse / dense forward | "
          "dense attention share | sparse attention share | sparse / dense attention | kept squares % | build forward ms | "
          "decode T=32 / dense | decode T=128 / dense |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for prompt in (96, 224, 480, 992, 2016, 4064):
        canvas = torch.cat([torch.randint(0, mask_id - 1, (1, prompt)),
                            torch.full((1, GEN), mask_id)], 1)
        width = canvas.shape[1]
        rows = (prompt, width)
        set_attention(model, "sparsed:skip=0")       # E = 1: dense at n = 0, build at n = 1
        cache = NoCache()
        state = cache.init_state(model)
        with torch.no_grad():
            cache.logits(model, canvas, None, rows, 0, state)
            canvas[0, prompt] = 5
            build = measure(lambda: cache.logits(model, canvas, None, rows, 0, state))[0]
            canvas[0, prompt + 1] = 5
            dense_model = load_model("embedded")
            dense, sparse = [], []
            for _ in range(REPEATS):                  # interleaved: the machine's load hits both
                dense.append(measure(lambda: dense_model(canvas, None, rows=rows)))
                sparse.append(measure(lambda: cache.logits(model, canvas, None, rows, 0, state)))
                assert state.any_sparse and not state.any_building
        d_fwd = statistics.median(f for f, _ in dense)
        s_fwd = statistics.median(f for f, _ in sparse)
        d_att = statistics.median(a for _, a in dense)
        s_att = statistics.median(a for _, a in sparse)
        tiles = -(-width // 128)
        kept = sum(float(p[..., :tiles, :tiles].float().mean()) for p in state.plans) / len(state.plans)
        print(f"| {prompt} | {width} | {1e3 * d_fwd:.1f} | {1e3 * s_fwd:.1f} | {s_fwd / d_fwd:.2f} | "
              f"{d_att / d_fwd:.2f} | {s_att / s_fwd:.2f} | {s_att / d_att:.2f} | {100 * kept:.0f} | {1e3 * build:.1f} | "
              f"{decode(32, d_fwd, s_fwd, build):.2f} | {decode(128, d_fwd, s_fwd, build):.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
