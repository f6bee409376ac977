"""Forward time of the embedded model on 40-token rows at batch 1, 8 and 32 (one thread), and the
rate of its products (projections and head) in GFLOP/s: is a batch cheaper per token?

    cd /tmp && OMP_NUM_THREADS=1 python /path/to/forward_rate.py
"""

import time

import torch

from dllm_decode.models import load_model

torch.set_num_threads(1)
model = load_model("embedded")
c = model.config
per_token = 2 * c.n_layers * (c.d_model * 3 * c.d_model + c.d_model ** 2 + 3 * c.d_model * c.mlp_hidden_size) \
    + 2 * c.d_model * c.vocab_size
for batch in (1, 8, 32):
    x = torch.randint(4, 100, (batch, 40))
    with torch.inference_mode():
        for _ in range(5):
            model(x)
        n = 200 if batch == 1 else 40
        started = time.perf_counter()
        for _ in range(n):
            model(x)
        seconds = (time.perf_counter() - started) / n
    print(f"batch {batch}: {seconds * 1e3:.2f} ms per forward, {batch * 40 * per_token / seconds / 1e9:.1f} GFLOP/s")
