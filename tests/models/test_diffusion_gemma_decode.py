"""The default DiffusionGemma decode against transformers' `DiffusionGemmaForBlockDiffusion.generate`
with the same seed: token for token, and the generator left where the reference leaves the
global one (the same draws, in order)."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.models.loading import load_model
from dllm_decode.sampler import generate
from tests.models.gemma_reference import CANVAS, write_reference

pytest.importorskip("transformers.models.diffusion_gemma")
from dllm_decode.schedulers import SCHEDULERS, UniformNoiseScheduler  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gemma")
    return write_reference(directory), load_model(directory)


CASES = [  # prompt lengths, seed, max_new_tokens, steps, eos (with pad 0), schedule overrides
    ((5,), 0, 24, 6, None, {}),                               # 3 canvases, full step budget
    ((7,), 3, 16, 6, None, {}),
    ((3,), 1, 24, 8, 18, {}),                                 # EOS in the 1st canvas: stops early
    ((4,), 2, 24, 6, None, {"confidence_threshold": 100.0}),  # stable-and-confident stop at step 2
    ((6, 4), 4, 24, 5, 58, {}),                               # a left-padded pair: both end early
]


@pytest.mark.parametrize("lengths,seed,new,steps,eos,schedule", CASES)
def test_default_decode_is_token_identical_to_the_reference(pair, lengths, seed, new, steps, eos, schedule):
    ref, model = pair
    generator = torch.Generator().manual_seed(100 + seed)
    prompts = [torch.randint(3, 128, (n,), generator=generator).tolist() for n in lengths]
    width = max(lengths)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kwargs = {"max_new_tokens": new, "max_denoising_steps": steps, "attention_mask": mask,
              **schedule}
    if eos is not None:
        kwargs.update(eos_token_id=eos, pad_token_id=0)
    torch.manual_seed(seed)
    expected = ref.generate(ids, **kwargs).sequences[:, width:]
    assert eos is None or expected.shape[1] < new        # the EOS cases do end early
    after_reference = torch.rand(3)

    model.eos_token_ids = () if eos is None else (eos,)
    model.generation_defaults = {} if eos is None else {"pad_token_id": 0}
    config = DecodeConfig(UniformNoiseScheduler(steps=steps, **schedule), gen_length=new,
                          block_length=CANVAS, stop_at_eos=eos is not None)
    ours = torch.Generator().manual_seed(seed)
    result = generate(model, prompts, config, generator=ours)
    assert result.tokens.shape == (len(lengths), new)
    assert torch.equal(result.tokens[:, :expected.shape[1]], expected)
    assert torch.equal(torch.rand(3, generator=ours), after_reference)     # same draws consumed
    if expected.shape[1] < new:                   # every row finished: the rest is end of text
        assert bool((result.tokens[:, expected.shape[1]:] == 0).all())
    assert bool((result.nfe >= 2).all())


def test_masked_rules_and_noise_rules_refuse_the_wrong_canvas(pair):
    from dllm_decode.testing import tiny_llada

    _, model = pair
    config = DecodeConfig(UniformNoiseScheduler(steps=2), gen_length=CANVAS, block_length=CANVAS)
    with pytest.raises(ValueError, match="does not run on a mask canvas"):
        generate(tiny_llada(), [[1, 2]], config)
    masked_only = [name for name, cls in SCHEDULERS.items() if "noise" not in cls.canvas_kinds]
    rule = SCHEDULERS[masked_only[0]]()
    with pytest.raises(ValueError, match="does not run on a noise canvas"):
        generate(model, [[1, 2]], DecodeConfig(rule, gen_length=CANVAS, block_length=CANVAS))


def test_noise_options_are_checked_as_a_whole():
    with pytest.raises(ValueError, match="t_min < t_max"):
        UniformNoiseScheduler(t_min=0.8, t_max=0.4)
    with pytest.raises(ValueError, match="entropy_bound"):
        UniformNoiseScheduler(entropy_bound=0.0)
