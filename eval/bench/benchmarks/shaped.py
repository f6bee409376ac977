"""`bench shaped`: a LLaDA-8B-shaped model with random weights on any device
(`dllm_decode.eval.bench.shaped`)."""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.protocol import (DEVICE, DTYPE, GEN_LENGTH, REPEATS, THREADS, Benchmark, Option,
                                             Say, Settings, blame, count, fill, later)


def run(settings: Settings, say: Say) -> dict[str, Any]:
    import torch

    from dllm_decode.devices import check_device
    from dllm_decode.eval.bench.shaped import NOISE_SHAPES, ShapedOptions, run_shaped
    from dllm_decode.eval.bench.shaped_noise import run_noise_shaped

    with blame("--device"):
        device = {"device": str(check_device(settings["device"]))} if settings.get("device") else {}
    from dllm_decode.eval.bench.peers import parse_peer

    with blame("--peer"):
        peers = tuple(parse_peer(text) for text in settings.get("peers", ()))
    options = fill(ShapedOptions, settings, **device, peers=peers)
    torch.set_num_threads(settings.get("threads", 1))
    return (run_noise_shaped if options.shape in NOISE_SHAPES else run_shaped)(options, say)


BENCHMARK = Benchmark(
    "shaped",
    "The GPU path: a LLaDA-8B-shaped model with random weights built on --device; tokens/s, loop "
    "overhead, cache speed-ups and each row's distance from the device's roofline floor at each batch "
    "size, with the captured step and peers' loops side by side, one interleaved run.",
    "Defaults: LLaDA-8B's shape, bfloat16, batch 1, 8, 32, 64, prompts of 64 tokens, gen 256, block "
    "32, 2 steps per block, none / prefix / dual, 2 repeats; --quick: the embedded shape, batch 1, 2, "
    "prompts of 8 tokens, gen 32, block 16, 1 repeat.",
    (Option(("--shape",), "shape", ("llada-8b", "embedded", "diffusion-gemma-26b-a4b", "diffusion-gemma-tiny"),
            "The architecture, with random weights [llada-8b]; the diffusion-gemma shapes decode "
            "uniform-noise canvases of --block-length (256 in the release) with --steps-per-block "
            "decoder steps each."),
     count("--layers", "layers", "Fewer layers than the shape's."), DEVICE,
     DTYPE.but(help="Weights and activations [bfloat16]."),
     count("--batch", "batch_sizes", "Batch sizes; repeatable.", multiple=True), GEN_LENGTH,
     count("--block-length", "block_length"),
     count("--steps-per-block", "steps_per_block", "Forwards per block (a fixed count: random weights "
           "never pass a threshold)."),
     Option(("--cache",), "caches", ("none", "prefix", "dual", "block"), "Caches to compare; repeatable "
            "[none, prefix, dual]; block decodes the shape's block-diffusion model.", multiple=True),
     Option(("--runtime",), "runtimes", ("reference", "compact"), "Runtimes to compare on the same "
            "weights; repeatable [reference].", multiple=True),
     Option(("--step",), "variants", ("eager", "captured"), "The step as the loop runs it by default, and the "
            "captured step (CUDA graphs on a GPU); repeatable [eager].", multiple=True),
     Option(("--capture",), "capture", ("auto", "static", "compile", "cuda-graphs", "regional"), "How the captured "
            "variant runs [auto: cuda-graphs on CUDA, static elsewhere]."),
     Option(("--peer",), "peers", str, "A reference loop's local checkout, NAME=PATH (fast-dllm=PATH: "
            "Fast-dLLM v1's generate_with_dual_cache and v2's batch_sample), run on the same weights; "
            "repeatable.", multiple=True, metavar="NAME=PATH"),
     count("--prompts", "prompts", "Prompts per configuration [the largest batch]."),
     count("--prompt-length", "prompt_length", "Tokens per random prompt [64]."),
     REPEATS, THREADS),
    run, later("dllm_decode.eval.bench.shaped", "format_shaped"),
    quick=dict(shape="embedded", batch_sizes=(1, 2), gen_length=32, block_length=16, repeats=1,
               prompt_length=8))
