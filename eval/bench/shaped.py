"""`dllm-decode bench shaped`: models of real shapes with random weights on any device.

The GPU serving path: tokens/s, loop overhead, cache speed-ups and each row's distance from the
device's roofline floor, at batch 1 to 64 and more, on a model of LLaDA-8B's shape (32 layers,
width 4096, 32 heads, MLP 12288, vocabulary 126,464) and, for the `block` cache, the
block-diffusion model of the same size class (Fast-dLLM v2 7B: Qwen2.5-7B's shape, block
`block_length`), random weights built on the device (no download, no checkpoint). Random weights
make the threshold rule commit one token per step, so the benchmark decodes a fixed number of
tokens per step (`low_confidence` with `steps_per_block`) and every configuration does the same
number of forwards; tokens/s counts canvas tokens (a random model's answers mean nothing).
`--layers` shrinks the depth (a CPU smoke run, or a GPU that cannot hold the weights).

Side by side in one interleaved run, on the same weights: the reference and compact runtimes
(`models/compact.py`), the eager and the captured step (`dllm_decode.capture`: static bucketed
buffers, CUDA graphs on a GPU), and peers' reference loops run unmodified from local checkouts
(`dllm_decode.eval.bench.peers`), each peer row with its commit and whether its tokens equal
this project's. Each row's floor (`dllm_decode.eval.bench.roofline`) is the larger of its
forwards' bytes over the device's memory bandwidth and FLOPs over its dense peak; a device
without datasheet peaks says "unknown device".

Every timed run, eager or captured, runs as a user's decode does: no extra device sync. Loop
overhead (the share of wall-clock outside the model's forward) comes from one more, untimed decode
per eager row whose forward timer synchronises around every forward (on CUDA that share is real
GPU idle time, not launch latency). A captured step or a peer's loop does not run its forwards
through `model.forward`: its overhead is not measured here (the device script times replays
instead). A captured row records its graphs in the warm-up, at every batch size it runs, never
inside a timed run. Rows report `token_agreement` with this project's first eager row: in bf16 a
random-weight model has near-ties that flip between kernels (a fraction, not a bug); in float32
the captured step is token-identical.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from typing import Any, Callable

import torch

from dllm_decode.eval.bench.outcome import ours
from dllm_decode.eval.bench.protocol import OptionError
from dllm_decode.eval.bench.timing import check_counts, interleave

SHAPES: dict[str, dict[str, Any]] = {
    "llada-8b": {},                                   # LLaDAConfig's defaults are LLaDA-8B's
    "embedded": dict(d_model=192, n_heads=6, n_layers=4, mlp_hidden_size=512, vocab_size=129,
                     max_sequence_length=1024, mask_token_id=3, eos_token_id=2, pad_token_id=0),
}
BLOCK_SHAPES: dict[str, dict[str, Any]] = {
    "llada-8b": {},                                   # FastDLLMConfig's defaults: Fast-dLLM v2 7B (Qwen2.5-7B)
    "embedded": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=6,
                     intermediate_size=512, vocab_size=129, max_position_embeddings=1024, head_dim=32,
                     rope_theta=10000.0, mask_token_id=3, eos_token_id=2, pad_token_id=0),
}
"""The block-diffusion model the `block` cache decodes, per shape: Fast-dLLM v2's 7B beside
LLaDA-8B (the field's block model of that size), the embedded block model's shape beside the
embedded one; its block is the benchmark's `block_length`."""
NOISE_SHAPES: dict[str, dict[str, Any]] = {
    "diffusion-gemma-26b-a4b": dict(vocab_size=262144, hidden_size=2816, intermediate_size=2112,
                                    num_hidden_layers=30, num_attention_heads=16, num_key_value_heads=8,
                                    head_dim=256, global_head_dim=512, num_global_key_value_heads=2,
                                    sliding_window=1024, num_experts=128, top_k_experts=8,
                                    moe_intermediate_size=704, max_position_embeddings=262144),
    "diffusion-gemma-tiny": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                                 num_global_key_value_heads=1, sliding_window=8, num_experts=4,
                                 top_k_experts=2, moe_intermediate_size=16, max_position_embeddings=4096),
}
"""Uniform-noise (DiffusionGemma) shapes, decoded by `shaped_noise`: the 26B-A4B's text stack (the
Gemma 4 26B-A4B numbers of its public model card: 30 layers at 5 sliding : 1 full, 16 heads, 8 KV
heads of 256 on sliding layers, 2 of 512 on full ones, window 1024, dense MLP 2112 beside 128
experts of 704 with top-8; counted on the meta device they give 25.2 B parameters and 3.8 B
active per token, the card's figures), and the tiny test model's; the canvas is `block_length`."""
CACHES = ("none", "prefix", "dual", "block")
RUNTIMES = ("reference", "compact")
VARIANTS = ("eager", "captured")


@dataclass(frozen=True)
class ShapedOptions:
    """What `bench shaped` runs (every count >= 1; `layers` None keeps the shape's depth).

    `caches` none / prefix / dual decode the LLaDA-shaped model, `block` the block-diffusion
    model of the shape (`BLOCK_SHAPES`). `variants`: `eager` (the loop as it runs by default) and
    `captured` (the captured step, where this build and device have it; a row that says why not
    otherwise). `peers`: (name, checkout path) pairs of reference loops run side by side on the
    same weights (`dllm_decode.eval.bench.peers`).
    """

    shape: str = "llada-8b"
    layers: int | None = None
    device: str = "cpu"
    dtype: str = "bfloat16"
    batch_sizes: tuple[int, ...] = (1, 8, 32, 64)
    prompt_length: int = 64
    gen_length: int = 256
    block_length: int = 32
    steps_per_block: int = 2
    repeats: int = 2
    caches: tuple[str, ...] = ("none", "prefix", "dual")
    runtimes: tuple[str, ...] = ("reference",)
    variants: tuple[str, ...] = ("eager",)
    peers: tuple[tuple[str, str], ...] = ()
    capture: str = "auto"
    prompts: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.shape not in SHAPES and self.shape not in NOISE_SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; choose from {sorted([*SHAPES, *NOISE_SHAPES])}")
        if self.layers is not None and self.layers < 1:
            raise ValueError(f"layers must be >= 1, got {self.layers}")
        check_counts(self, "prompt_length", "gen_length", "block_length", "steps_per_block", "repeats")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch sizes must be >= 1, got {list(self.batch_sizes)}")
        if self.prompts is not None and self.prompts < 1:
            raise ValueError(f"prompts must be >= 1, got {self.prompts}")
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length ({self.gen_length}) must be a multiple of block_length "
                             f"({self.block_length})")
        if self.steps_per_block > self.block_length:
            raise ValueError(f"steps_per_block ({self.steps_per_block}) must be at most block_length "
                             f"({self.block_length})")
        unknown = set(self.caches) - set(CACHES)
        if unknown or not self.caches:
            raise ValueError(f"caches must be some of {list(CACHES)}, got {list(self.caches)}")
        if set(self.runtimes) - set(RUNTIMES) or not self.runtimes:
            raise ValueError(f"runtimes must be some of {list(RUNTIMES)}, got {list(self.runtimes)}")
        if set(self.variants) - set(VARIANTS) or not self.variants:
            raise ValueError(f"variants must be some of {list(VARIANTS)}, got {list(self.variants)}")

    @property
    def prompt_count(self) -> int:
        """Prompts decoded per configuration: `prompts`, else the largest batch size."""
        return self.prompts or max(self.batch_sizes)


def shaped_model(options: ShapedOptions, family: str = "llada") -> Any:
    """A model of the option's shape, seeded random weights, built directly on the device:
    `llada` (none / prefix / dual caches) or `block` (the block-diffusion model of `BLOCK_SHAPES`,
    block = `block_length`)."""
    device, dtype = torch.device(options.device), getattr(torch, options.dtype)
    torch.manual_seed(options.seed)
    with torch.device(device):
        model = _build(options, family).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.02)                       # q/k/v biases (Qwen2)
            else:
                p.fill_(1.0)                               # norm scales
    return model.eval()


def _build(options: ShapedOptions, family: str) -> Any:
    """The family's model of the option's shape, built on the current default device."""
    if family == "noise":
        from dllm_decode.models.diffusion_gemma import DiffusionGemmaConfig, DiffusionGemmaModel

        text = dict(NOISE_SHAPES[options.shape])
        if options.layers is not None:
            text["num_hidden_layers"] = options.layers
        return DiffusionGemmaModel(DiffusionGemmaConfig.from_dict({"canvas_length": options.block_length,
                                                                   "text_config": text}))
    if family == "block":
        from dllm_decode.models.fast_dllm import FastDLLMConfig, FastDLLMModel

        sizes = dict(BLOCK_SHAPES[options.shape], bd_size=options.block_length)
        if options.layers is not None:
            sizes["num_hidden_layers"] = options.layers
        return FastDLLMModel(FastDLLMConfig(**sizes))
    from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM

    sizes = dict(SHAPES[options.shape])
    if options.layers is not None:
        sizes["n_layers"] = options.layers
    return LLaDAModelLM(LLaDAConfig(**sizes))


def model_bytes(options: ShapedOptions, family: str = "llada") -> int:
    """The peak bytes building the family's model of this shape takes on the device: its
    parameters, counted on the meta device (nothing allocated), built in float32 before the cast
    (the canvas and caches come on top)."""
    with torch.device("meta"):
        model = _build(options, family)
    return sum(p.numel() for p in model.parameters()) * max(4, getattr(torch, options.dtype).itemsize)


def device_memory(device: torch.device) -> int | None:
    """Bytes free on `device` now (CUDA: the driver's count; the CPU: `MemAvailable`), or None."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        from dllm_decode.models.checkpoint import available_memory

        return available_memory()
    return None


def check_memory(options: ShapedOptions, families: set[str]) -> None:
    """Refuse, before any weight is built, a run whose models cannot fit the device's free memory
    (an allocation error deep in a constructor otherwise), naming the depth that would fit.

    Raises:
        OptionError: naming `--layers` and the memory.
    """
    free = device_memory(torch.device(options.device))
    need = sum(model_bytes(options, family) for family in families)
    if free is None or need <= free:
        return
    one, two = (sum(model_bytes(dataclass_replace(options, layers=n), family) for family in families)
                for n in (1, 2))
    layer = max(1, two - one)
    depth = max(0, int((free * 0.8 - (one - layer)) // layer))     # a fifth kept for the canvas
    fits = f"--layers {depth} fits" if depth >= 1 else "no depth of this shape fits; try --shape embedded"
    raise OptionError("--layers", f"the {options.shape} models need at least {need / 2 ** 30:.1f} GiB of "
                                  f"parameters and {options.device} has {free / 2 ** 30:.1f} GiB free; {fits}")


def prompts_for(model: Any, options: ShapedOptions, count: int) -> list[list[int]]:
    """`count` random prompts of `prompt_length` ordinary tokens (never [MASK] or EOS)."""
    generator = torch.Generator().manual_seed(options.seed)
    special = {model.mask_token_id, *model.eos_token_ids}
    ids = torch.randint(0, model.vocab_size, (count, options.prompt_length), generator=generator)
    ids = ids.masked_fill(torch.isin(ids, torch.tensor(sorted(special))), 5)
    return ids.tolist()


@dataclass(frozen=True)
class Subject:
    """One row kind of the run: what decodes (a runtime view, a captured step, a peer loop) under
    which cache, or why it cannot run here (`missing`)."""

    runtime: str
    variant: str
    cache: str
    family: str
    decode: Callable[[list[list[int]]], Any] | None
    missing: str | None = None
    batch_limit: int | None = None
    commit: str | None = None
    profile: Callable[[list[list[int]]], Any] | None = None


def run_shaped(options: ShapedOptions, say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Decode `prompt_count` prompts in batches of each size under each cache, runtime, variant
    and peer, interleaved; returns the JSON-ready report (one row per configuration, each with
    its roofline floor on this device)."""
    from dllm_decode import DecodeConfig
    from dllm_decode.caches import CACHES as REGISTRY
    from dllm_decode.devices import device_name, device_peaks, device_sync
    from dllm_decode.eval.bench.captured import captured_decoder
    from dllm_decode.eval.bench.forward import runtime_view
    from dllm_decode.eval.bench.roofline import UNKNOWN_DEVICE, ModelShape, floor, forward_plan
    from dllm_decode.schedulers import LowConfidenceScheduler

    if options.shape in NOISE_SHAPES:
        raise OptionError("--shape", f"{options.shape} decodes uniform-noise canvases: run it with "
                                     f"dllm_decode.eval.bench.shaped_noise.run_noise_shaped")
    device = torch.device(options.device)
    sync = device_sync(device)
    families = {"block" if cache == "block" else "llada" for cache in options.caches}
    check_memory(options, families)
    models = {family: shaped_model(options, family) for family in sorted(families)}
    prompts = {family: prompts_for(model, options, options.prompt_count) for family, model in models.items()}
    configs = {cache: DecodeConfig(scheduler=LowConfidenceScheduler(steps_per_block=options.steps_per_block),
                                   cache=REGISTRY[cache](), gen_length=options.gen_length,
                                   block_length=options.block_length, stop_at_eos=False)
               for cache in options.caches}
    subjects: list[Subject] = []
    pools: dict[str, Any] = {}
    for runtime in options.runtimes:
        for cache in options.caches:
            family = "block" if cache == "block" else "llada"
            try:
                view = runtime_view(models[family], runtime)
            except ValueError as err:
                subjects += [Subject(runtime, v, cache, family, None, str(err)) for v in options.variants]
                continue
            for variant in options.variants:
                if variant == "eager":          # timed unsynced; `profile` syncs per forward for the overhead
                    subjects.append(Subject(runtime, variant, cache, family,
                                            lambda chunk, v=view, c=configs[cache]: ours(v, chunk, c, None),
                                            profile=lambda chunk, v=view, c=configs[cache]: ours(v, chunk, c, sync)))
                elif runtime == "reference":
                    subjects.append(Subject(runtime, variant, cache, family, None,
                                            "not available: the captured step runs the compact runtime's "
                                            "blocks (its row is compact captured)"))
                else:
                    decode, missing, graphs = captured_decoder(view, configs[cache], sync, options.capture,
                                                               max(options.batch_sizes))
                    subjects.append(Subject(runtime, variant, cache, family, decode, missing))
                    pools[f"{runtime}@{cache}"] = graphs
    subjects += _peer_subjects(options, models, configs)
    label = {id(s): f"{s.runtime}@{s.variant}@{s.cache}" for s in subjects}
    plans = [(f"{label[id(s)]}@B{b}", [prompts[s.family][i:i + b] for i in range(0, options.prompt_count, b)])
             for s in subjects if s.decode is not None for b in options.batch_sizes
             if s.batch_limit is None or b <= s.batch_limit]
    by_label = {f"{label[id(s)]}@B{b}": s for s in subjects for b in options.batch_sizes}
    for s in subjects:        # warm-up; a captured step records its graphs here, at every batch size
        if s.decode is not None and not s.runtime.startswith("peer:"):
            for b in (options.batch_sizes if s.variant == "captured" else (1,)):
                s.decode(prompts[s.family][:b])
    shapes = {family: ModelShape.of(model) for family, model in models.items()}
    name = device_name(device)
    peaks = device_peaks(name)
    say(f"{options.shape} on {name}: {len(plans)} configurations x {options.repeats} repeats")
    if not plans:
        why = sorted({s.missing for s in subjects if s.missing})
        raise OptionError(None, "nothing to run: no configuration is available on this build and "
                                "device" + (f" ({'; '.join(why)})" if why else ""))
    runs = interleave(plans, options.repeats, lambda lab, index, chunk: (lambda: by_label[lab].decode(chunk)))

    def row(s: Subject, b: int) -> dict[str, Any]:
        base = {"runtime": s.runtime, "variant": s.variant, "cache": s.cache, "batch": b, "model": s.family,
                **({"commit": s.commit} if s.commit else {})}
        if s.decode is None:
            return {**base, "available": False, "note": s.missing}
        if s.batch_limit is not None and b > s.batch_limit:
            return {**base, "available": False, "note": f"decodes at most {s.batch_limit} prompt(s) per call"}
        measured = runs[f"{label[id(s)]}@B{b}"]
        spent = measured.seconds()
        outcomes = measured.values()
        forwards = sum(o.forwards for o in outcomes)
        plan = forward_plan(s.cache, options.prompt_length, options.gen_length, options.block_length,
                            options.steps_per_block)
        bound = floor(shapes[s.family], plan, b, peaks, options.dtype)
        overhead = _overhead(s.profile, prompts[s.family][:b], sync) if s.profile else None
        return {**base, **timed_row(options, spent, outcomes, bound), "overhead": overhead}

    rows = [row(s, b) for s in subjects for b in options.batch_sizes]
    _compare(rows)
    return {"options": {**options.__dict__, "batch_sizes": list(options.batch_sizes),
                        "caches": list(options.caches), "runtimes": list(options.runtimes),
                        "variants": list(options.variants), "peers": [list(p) for p in options.peers]},
            "device_name": name, "peaks": peaks.__dict__ if peaks else UNKNOWN_DEVICE,
            "parameters": {family: sum(p.numel() for p in model.parameters()) for family, model in models.items()},
            "prompts": options.prompt_count, "rows": rows,
            "graph_pools": {key: {"mode": g.mode, "captures": g.captures, "pool_bytes": g.pool_bytes}
                            for key, g in pools.items() if g is not None}}


def timed_row(options: ShapedOptions, spent: float, outcomes: list[Any], bound: Any) -> dict[str, Any]:
    """A measured row's figures: `spent` seconds (median over repeats) for `outcomes` (one per
    batch decoded), against `bound` (a `roofline.Floor` of one decode, or None)."""
    from dllm_decode.eval.bench.roofline import UNKNOWN_DEVICE

    forwards = sum(o.forwards for o in outcomes)
    return {"available": True, "seconds": spent, "tokens_per_second": options.gen_length * options.prompt_count / spent,
            "overhead": None, "nfe": statistics.fmean(n for o in outcomes for n in o.nfe),
            "forwards": forwards, "ms_per_forward": 1000 * spent / max(forwards, 1),
            "floor_ms": bound.ms_per_forward if bound else None,
            "read_floor_ms": 1000 * bound.read_seconds / bound.forwards if bound else None,
            "compute_floor_ms": 1000 * bound.compute_seconds / bound.forwards if bound else None,
            "x_floor": spent / (bound.seconds * len(outcomes)) if bound else None,
            "floor_note": None if bound else UNKNOWN_DEVICE,
            "tokens": [t for o in outcomes for t in o.tokens]}


def _overhead(profile: Callable[[list[list[int]]], Any], chunk: list[list[int]],
              sync: Callable[[], None] | None) -> float | None:
    """Share of one decode's wall-clock outside its forwards, the forwards timed with a device
    sync around each (an untimed run beside the timed ones, which never sync per forward)."""
    sync = sync or (lambda: None)
    sync()
    started = time.perf_counter()
    outcome = profile(chunk)
    sync()
    wall = time.perf_counter() - started
    if outcome.forward_seconds is None or wall <= 0:
        return None
    return max(0.0, 1 - outcome.forward_seconds / wall)


def _peer_subjects(options: ShapedOptions, models: dict[str, Any], configs: dict[str, Any]) -> list[Subject]:
    """One subject per peer loop that the named checkouts hold, on the same weights as this
    project's rows (a row saying why not when the peer cannot run here or its cache is not in the
    run); each runs once untimed before timing starts (its own warm-up)."""
    from dllm_decode.eval.bench.peers import CHECKOUTS, PEER_LOOPS, load_peer, loops_in

    subjects = []
    for checkout, path in options.peers:
        if checkout not in CHECKOUTS:
            raise ValueError(f"unknown peer {checkout!r}; known: {sorted(CHECKOUTS)}")
        found = loops_in(checkout, path)
        if not found:
            subjects.append(Subject(f"peer:{checkout}", "eager", "-", "llada", None,
                                    f"not available: {path} holds none of {list(CHECKOUTS[checkout])}"))
        for name in found:
            loop = PEER_LOOPS[name]
            if loop.cache not in options.caches:
                subjects.append(Subject(f"peer:{name}", "eager", loop.cache, loop.family, None,
                                        f"not available: needs the {loop.cache} cache in the run "
                                        f"(add --cache {loop.cache})"))
                continue
            try:
                peer = load_peer(name, path, models[loop.family], options)
                limit = getattr(peer.decode, "batch_limit", None)
                prompt = prompts_for(models[loop.family], options, 1)
                peer.decode(prompt)
            except Exception as err:                    # the peer's own code: any failure is its row's note
                text = str(err).strip().splitlines()
                subjects.append(Subject(f"peer:{name}", "eager", loop.cache, loop.family, None,
                                        f"not available: {type(err).__name__}: {text[0] if text else ''}"))
                continue
            subjects.append(Subject(f"peer:{name}@{peer.commit[:12]}", "eager", loop.cache, loop.family,
                                    peer.decode, batch_limit=limit, commit=peer.commit))
    return subjects


def _compare(rows: list[dict[str, Any]]) -> None:
    """Add ratios and token identity to the rows, in place, and drop their tokens.

    `vs_none`: the same runtime and variant without a cache (LLaDA rows); `vs_reference`: the
    reference runtime's eager row; `vs_eager`: a captured row against its eager row; peers:
    `identical_tokens` against this project's first eager row with their cache and batch, and
    `ours_speedup` = the peer's seconds over the fastest of this project's rows there."""
    ready = [r for r in rows if r["available"]]

    def find(**keys: Any) -> dict[str, Any] | None:
        return next((r for r in ready if all(r[k] == v for k, v in keys.items())), None)

    def ratio(base: dict[str, Any] | None, row: dict[str, Any]) -> float | None:
        return base["seconds"] / row["seconds"] if base else None

    for r in ready:
        peer = r["runtime"].startswith("peer:")
        same = dict(cache=r["cache"], batch=r["batch"])
        r["vs_none"] = (ratio(find(runtime=r["runtime"], variant=r["variant"], cache="none", batch=r["batch"]), r)
                        if r["model"] == "llada" and not peer else None)
        r["vs_reference"] = None if peer else ratio(find(runtime="reference", variant="eager", **same), r)
        r["vs_eager"] = (ratio(find(runtime=r["runtime"], variant="eager", **same), r)
                         if r["variant"] != "eager" else None)
        baseline = next((b for b in ready if b["variant"] == "eager" and not b["runtime"].startswith("peer:")
                         and b["cache"] == r["cache"] and b["batch"] == r["batch"]), None)
        r["same_tokens_as"] = None if baseline is None or baseline is r else f"{baseline['runtime']} eager"
        r["identical_tokens"] = (None if r["same_tokens_as"] is None else r["tokens"] == baseline["tokens"])
        r["token_agreement"] = None if r["same_tokens_as"] is None else _agreement(r["tokens"], baseline["tokens"])
        if peer:
            ours_rows = [b for b in ready if not b["runtime"].startswith("peer:") and b["cache"] == r["cache"]
                         and b["batch"] == r["batch"]]
            best = min(ours_rows, key=lambda b: b["seconds"], default=None)
            r["ours_speedup"] = ratio(r, best) if best else None
            r["ours_best"] = f"{best['runtime']} {best['variant']}" if best else None
    for r in rows:
        r.pop("tokens", None)


def _agreement(tokens: list[list[int]], baseline: list[list[int]]) -> float | None:
    """Fraction of equal tokens, position by position (None when the shapes differ)."""
    if len(tokens) != len(baseline) or any(len(a) != len(b) for a, b in zip(tokens, baseline)):
        return None
    total = sum(len(b) for b in baseline)
    return sum(x == y for a, b in zip(tokens, baseline) for x, y in zip(a, b)) / total if total else 1.0


def format_shaped(report: dict[str, Any]) -> str:
    """The report as a table: one line per runtime, variant, cache and batch size."""
    o = report["options"]
    depth = f", {o['layers']} layers" if o["layers"] else ""
    params = ", ".join(f"{family} {count / 1e6:,.1f} M" for family, count in report["parameters"].items())
    peaks = report["peaks"]
    device = (f"{report['device_name']} (floors from {peaks['name']}: {peaks['hbm_bytes_per_s'] / 1e12:.2f} TB/s, "
              f"{o['dtype']} peak {peaks['flops'].get(_SHORT.get(o['dtype'], o['dtype']), 0) / 1e12:.0f} TFLOP/s)"
              if isinstance(peaks, dict) else f"{report['device_name']} (floors: {peaks})")
    lines = [f"{o['shape']}{depth} ({params} parameters), {o['dtype']} on {device}; "
             f"{report['prompts']} prompts of {o['prompt_length']} tokens, gen {o['gen_length']}, "
             f"block {o['block_length']}, {o['steps_per_block']} steps per block",
             f"{'runtime':<31}{'variant':<10}{'cache':<7}{'batch':>6}{'tokens/s':>11}{'overhead':>9}{'NFE':>6}"
             f"{'ms/fwd':>9}{'floor ms':>15}{'x floor':>8}{'vs none':>8}{'vs reference':>13}{'vs eager':>9}  same tokens"]

    def ratio(value: float | None) -> str:
        return f"{value:.2f}x" if value is not None else "-"

    for batch, step in (report.get("step_floors") or {}).items():     # the noise shapes
        if step:
            lines.insert(1, f"one self-conditioned decoder step at batch {batch} reads {step['bytes'] / 1e9:.2f} GB: "
                            f"read floor {step['read_floor_ms']:.3f} ms, compute floor {step['compute_floor_ms']:.3f} ms")
    for row in report["rows"]:
        head = f"{row['runtime'][:30]:<31}{row['variant']:<10}{row['cache']:<7}{row['batch']:>6}"
        if not row["available"]:
            lines.append(f"{head}  {row['note']}")
            continue
        overhead = f"{row['overhead']:.1%}" if row["overhead"] is not None else "-"
        floor_ms = f"{row['floor_ms']:.2f}" if row["floor_ms"] is not None else row["floor_note"]
        agreement = row.get("token_agreement")
        same = ("-" if row["identical_tokens"] is None else "yes" if row["identical_tokens"] else
                f"{agreement:.1%}" if agreement is not None else "NO")
        extra = (f"  (ours {ratio(row['ours_speedup'])} faster: {row['ours_best']})"
                 if row.get("ours_speedup") is not None else "")
        lines.append(f"{head}{row['tokens_per_second']:>11.1f}{overhead:>9}{row['nfe']:>6.1f}"
                     f"{row['ms_per_forward']:>9.2f}{floor_ms:>15}{ratio(row['x_floor']):>8}"
                     f"{ratio(row['vs_none']):>8}{ratio(row['vs_reference']):>13}{ratio(row['vs_eager']):>9}"
                     f"  {same}{extra}")
    return "\n".join(lines)


_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
