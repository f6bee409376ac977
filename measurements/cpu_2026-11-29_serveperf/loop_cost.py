"""Event-loop and client CPU per request: GET /health, GET /v1/models, and a short completion (one client, in series)."""
import os, threading, time, json, subprocess, sys, torch
from dllm_decode.eval.bench.subject import load_subject
from dllm_decode.config import DecodeConfig
from dllm_decode.registry import component
from dllm_decode.engine import Engine
from dllm_decode.serve.app import Limits, ServerState, background
from dllm_decode.serve.protocol import Settings
from dllm_decode.serve.worker import EngineWorker
torch.set_num_threads(1)
b = load_subject("embedded")
config = DecodeConfig(scheduler=component("scheduler", {"name": "threshold", "threshold": 0.9}), gen_length=32, block_length=8)
state = ServerState(EngineWorker(Engine(b.model, b.tokenizer, max_batch_size=32), threads=1), Settings(model_id="embedded", config=config, max_tokens=1024), Limits(max_queue=320))
CLIENT = r'''
import http.client, sys, time, json
u = sys.argv[1].split(":"); c = http.client.HTTPConnection(u[1][2:], int(u[2]))
path, method, body, n = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
for i in range(n+20):
    if i == 20: t = time.perf_counter(); cpu = time.process_time()
    c.request(method, path, body if method == "POST" else None, {"Content-Type": "application/json"}); r = c.getresponse(); r.read()
print(json.dumps({"ms": (time.perf_counter()-t)/n*1e3, "client_cpu_ms": (time.process_time()-cpu)/n*1e3}))
'''
def cpu_of(name):
    for t in threading.enumerate():
        if t.name.startswith(name):
            f = open(f"/proc/self/task/{t.native_id}/stat").read().rsplit(")",1)[1].split()
            return (int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK")
with background(state) as url:
    for path, method, body, n in (("/health","GET","",2000), ("/v1/models","GET","",2000), ("/v1/completions","POST",json.dumps({"model":"embedded","prompt":"sort : bob al"}),300)):
        c0 = cpu_of("dllm-serve"); e0 = cpu_of("dllm-engine")
        out = subprocess.run([sys.executable, "-c", CLIENT, url, path, method, body, str(n)], capture_output=True, text=True).stdout
        print(path, out.strip(), "loop CPU ms/req", round((cpu_of("dllm-serve")-c0)/n*1e3,3), "engine CPU ms/req", round((cpu_of("dllm-engine")-e0)/n*1e3,3))
