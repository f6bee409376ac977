import http.client, json, time, statistics, sys
sys.path.insert(0, '.')   # run from the repository root
import torch
torch.set_num_threads(1)
from dllm_decode.modelspec import ModelSpec, load_diffusion
from tests.serve.conftest import make_state, default_config
import dllm_decode.serve.app as app
import dllm_decode.serve.protocol as protocol
from dllm_decode.engine import Engine
m = load_diffusion(ModelSpec.parse("embedded"))
cfg = default_config(gen_length=32, block_length=8)
marks = {}
def wrap(obj, name, label):
    orig = getattr(obj, name)
    def f(*a, **k):
        marks.setdefault(label, []).append(time.perf_counter())
        return orig(*a, **k)
    setattr(obj, name, f)
wrap(app, "parse_job", "parse_job")
wrap(app, "_submit", "submit")
wrap(Engine, "add", "engine_add")
wrap(Engine, "_finish", "engine_finish")
wrap(app, "reply", "reply")
state = make_state(m, max_batch_size=8, config=cfg)
prompts = [f"sort: {i%10} {(i*3)%10} {(i*7)%10}" for i in range(30)]
with app.background(state) as url:
    host, port = url[7:].split(":")
    c = http.client.HTTPConnection(host, int(port))
    starts, ends = [], []
    for p in prompts:
        starts.append(time.perf_counter())
        c.request("POST", "/v1/completions", json.dumps({"prompt": p, "max_tokens": 32}), {"Content-Type": "application/json"})
        r = c.getresponse(); r.read()
        ends.append(time.perf_counter())
seq = ["parse_job", "submit", "engine_add", "engine_finish", "reply"]
n = len(prompts)
def med(xs): return statistics.median(xs) * 1000
print("send->parse", med([marks["parse_job"][i] - starts[i] for i in range(n)]))
for a, b in zip(seq, seq[1:]):
    print(f"{a}->{b}", med([marks[b][i] - marks[a][i] for i in range(n)]))
print("reply->end", med([ends[i] - marks["reply"][i] for i in range(n)]))
print("total", med([ends[i] - starts[i] for i in range(n)]))
