"""DiffusionGemma under tensor and expert parallelism: two gloo ranks (one process each, as under
`torchrun`) against the same seeded model in one process.

Each rank writes its logits and decodes to a file; the test compares them with the one-process
run. TP sums partial products across ranks, so logits agree within the stated float tolerance
(`assert_logits_close`), not bitwise; the logits after the head's gather are the same bytes on every
rank. The default decode (the checkpoint's shipped uniform-noise decoding, seeded) is
token-identical to one process: each rank draws the noise from its own copy of the request's
generator.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.models.gemma_layers import GemmaExperts, set_moe_impl
from dllm_decode.sampler import generate
from dllm_decode.testing import assert_logits_close, tiny_diffusion_gemma
from tests.distributed.launching import free_port, spawn

PROMPTS = [[5, 9, 4, 11, 7], [7, 2, 20]]
IDS = torch.tensor([[5, 9, 4, 11, 7, 8, 3], [7, 2, 20, 6, 6, 14, 25]])
CANVAS = torch.tensor([[40, 41, 42, 43, 44, 45, 46, 47], [50, 3, 90, 17, 17, 60, 2, 127]])
SEEDS = (0, 1, 2)


def _model(impl: str = "loop"):
    return set_moe_impl(tiny_diffusion_gemma(seed=0, steps=4), impl)


SC = 4 * torch.randn(2, 8, 128, generator=torch.Generator().manual_seed(7))
"""Previous-step logits for self-conditioning, the same on every path (a step's own logits as
input would compare two forwards' rounding, amplified by the softmax, not one forward)."""


def _logits(model) -> list[torch.Tensor]:
    """The encoder over IDS, then a decoder step on CANVAS without and with self-conditioning."""
    return _logits_with(model, model.denoise)


def _logits_with(model, denoise) -> list[torch.Tensor]:
    cache = model.encode(IDS)
    return [denoise(CANVAS, cache), denoise(CANVAS, cache, SC)]


def _decodes(model) -> list[list[list[int]]]:
    config = DecodeConfig.for_model(model, gen_length=16)
    return [generate(model, PROMPTS, config, generator=torch.Generator().manual_seed(s)).tokens.tolist()
            for s in SEEDS]


def _save(model, directory: Path, untie: str | None = None) -> None:
    """The model as a checkpoint directory laid out as the reference saves it (config.json +
    safetensors: the decoder's weights and their tied encoder copies), with the copy of `untie`
    changed when given."""
    from safetensors.torch import save_file

    from dllm_decode.models.diffusion_gemma import ENCODER
    from tests.models.gemma_reference import TEXT

    directory.mkdir()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    for name in list(state):
        if name.startswith("model.decoder.") and "self_conditioning" not in name and "layer_scalar" not in name:
            copy = ENCODER + name[len("model.decoder."):]
            state[copy] = state[name] + (1e-3 if copy == untie else 0)
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"model_type": "diffusion_gemma", "canvas_length": 8,
                                                       "text_config": TEXT}))
    (directory / "generation_config.json").write_text(json.dumps({"max_denoising_steps": 4}))


def _worker(rank: int, world: int, port: int, out: str, layout: str, impl: str, checkpoint: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    from dllm_decode.models.loading import load_model
    from dllm_decode.parallel import CollectiveCounter, init_parallel, shutdown_parallel
    from dllm_decode.parallel.diffusion_gemma import shard_diffusion_gemma
    from dllm_decode.parallel.experts import shard_experts

    try:
        groups = init_parallel(world)
        if layout == "ep-only":                   # attention replicated, experts split
            model = shard_experts(_model(impl), groups.tp_group)
        else:
            model = shard_diffusion_gemma(_model(impl), groups, experts=layout)
        held = [list(m.gate_up_proj.shape) for m in model.modules() if isinstance(m, GemmaExperts)]
        with torch.no_grad(), CollectiveCounter() as counter:
            cache = model.encode(IDS)
            model.denoise(CANVAS, cache, torch.zeros(2, 8, 128))
        record = {"held": held, "logits": [t.tolist() for t in _logits(model)], "decodes": _decodes(model),
                  "counts": dict(counter.counts)}
        if impl == "static" and layout == "intermediate":      # the captured forward on the shards
            from dllm_decode.capture import CapturedDenoise, GraphCache

            captured = CapturedDenoise(model, GraphCache("compile", backend="eager", length_step=8))
            record["captured"] = [t.tolist() for t in _logits_with(model, captured.denoise)]
        if checkpoint:
            loaded = set_moe_impl(load_model(checkpoint, dtype=torch.float32, tensor_parallel=world), impl)
            record["loaded"] = [t.tolist() for t in _logits(loaded)]
            record["loaded_decodes"] = _decodes(loaded)
        Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    finally:
        shutdown_parallel()


def _run(tmp_path: Path, layout: str, impl: str, checkpoint: bool = False) -> list[dict]:
    path = ""
    if checkpoint:
        _save(_model(), tmp_path / "ckpt")
        path = str(tmp_path / "ckpt")
    spawn(_worker, (2, free_port(), str(tmp_path), layout, impl, path), 2, tmp_path)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def _check(ranks: list[dict], key: str = "logits", decodes: str = "decodes") -> None:
    one = _model()
    with torch.no_grad():
        expected = _logits(one)
    assert ranks[0][key] == ranks[1][key]                     # the same bytes on every rank
    for got, want in zip(ranks[0][key], expected):
        assert_logits_close(torch.tensor(got), want)
    reference = _decodes(one)
    assert all(r[decodes] == reference for r in ranks)         # token-identical, 3 seeds


def test_tp2_logits_and_default_decode_equal_one_process(tmp_path):
    """Heads, KV heads (sliding 2 split; the full layer's 1 replicated), dense and
    self-conditioning MLPs split, 2 of 4 experts per rank, vocabulary-parallel tied head; and the
    same from a checkpoint loaded with `tensor_parallel=2`."""
    ranks = _run(tmp_path, "expert", "static", checkpoint=True)
    assert ranks[0]["held"] == [[2, 32, 32]] * 2 and ranks[1]["held"] == [[2, 32, 32]] * 2
    _check(ranks)
    _check(ranks, "loaded", "loaded_decodes")
    layers = 2       # per layer o, dense down, experts; plus lookup, soft embedding, self-conditioning
    assert ranks[0]["counts"] == {"all_reduce": 2 * (3 * layers + 1) + 2, "all_gather_into_tensor": 1}


@pytest.mark.slow
@pytest.mark.parametrize("layout, impl", [("intermediate", "static"), ("intermediate", "loop"),
                                          ("expert", "loop"), ("ep-only", "loop"), ("ep-only", "static")])
def test_other_layouts_equal_one_process(tmp_path, layout, impl):
    ranks = _run(tmp_path, layout, impl)
    expected = {"intermediate": [4, 16, 32], "expert": [2, 32, 32], "ep-only": [2, 32, 32]}[layout]
    assert all(r["held"] == [expected] * 2 for r in ranks)
    _check(ranks)
    if (layout, impl) == ("intermediate", "static"):  # compiled fullgraph over the functional collectives
        for got, want in zip(ranks[0]["captured"], ranks[0]["logits"]):
            assert_logits_close(torch.tensor(got), torch.tensor(want))


def _refusal_worker(rank: int, world: int, port: int, out: str, checkpoint: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    from dllm_decode.models.checkpoint import ModelLoadError
    from dllm_decode.models.loading import load_model
    from dllm_decode.parallel import shutdown_parallel

    try:
        load_model(checkpoint, tensor_parallel=world)
        message = ""
    except ModelLoadError as err:
        message = str(err)
    finally:
        shutdown_parallel()
    Path(out, f"rank{rank}.json").write_text(json.dumps(message))


@pytest.mark.slow
def test_a_sharded_load_refuses_an_untied_encoder_copy(tmp_path):
    """As the whole load does: each rank compares the slices it reads with their encoder copies."""
    bad = "model.encoder.language_model.layers.1.self_attn.q_proj.weight"
    _save(_model(), tmp_path / "ckpt", untie=bad)
    spawn(_refusal_worker, (2, free_port(), str(tmp_path), str(tmp_path / "ckpt")), 2, tmp_path)
    messages = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(f"{bad} differs from the decoder weight it is tied to" in m for m in messages)


def test_sizes_that_do_not_divide_are_refused():
    from dllm_decode.parallel import ParallelError, ParallelGroups
    from dllm_decode.parallel.diffusion_gemma import shard_diffusion_gemma

    groups = ParallelGroups(tp=4, tp_rank=0)
    with pytest.raises(ParallelError, match="2 attention heads.*legal sizes for this model: \\[1, 2\\]"):
        shard_diffusion_gemma(copy.deepcopy(_model()), groups)
    with pytest.raises(ParallelError, match="accepted: \\['expert', 'intermediate'\\]"):
        shard_diffusion_gemma(_model(), ParallelGroups(tp=2, tp_rank=0), experts="rows")
