"""Tiny models for tests and `--model tiny`: a seeded random LLaDA and an oracle predictor."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM


def tiny_llada(seed: int = 0, vocab_size: int = 37, layers: int = 2, max_length: int = 512) -> LLaDAModelLM:
    """A seeded random LLaDA (width 32, odd vocab): exercises every code path, decodes noise.

    Mask id is the last id, EOS the one before it.
    """
    generator = torch.Generator().manual_seed(seed)
    config = LLaDAConfig(d_model=32, n_heads=4, n_layers=layers, mlp_hidden_size=48,
                         vocab_size=vocab_size, max_sequence_length=max_length,
                         mask_token_id=vocab_size - 1, eos_token_id=vocab_size - 2,
                         pad_token_id=vocab_size - 2)
    model = LLaDAModelLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3 if p.dim() > 1 else torch.ones(p.shape))
    return model.eval()


class OracleMaskPredictor(nn.Module):
    """Puts probability `confidence[i]` on `target[i]` at every generated position i.

    Positions are counted from the generation start (the canvas tail of length G = len(target)),
    so a test can state exactly which positions a scheduler commits, and when. The rest of the
    probability is spread evenly over the other non-mask tokens.
    """

    supports_kv = False

    def __init__(self, target: Tensor, confidence: Tensor, vocab_size: int, mask_token_id: int,
                 eos_token_id: int):
        super().__init__()
        self.mask_token_id, self.eos_token_ids = mask_token_id, (eos_token_id,)
        self.vocab_size, self.max_length = vocab_size, None
        self.tokenizer = None
        rest = ((1 - confidence) / (vocab_size - 2)).unsqueeze(-1).repeat(1, vocab_size)
        probs = rest.clone()
        probs[torch.arange(target.numel()), target] = confidence
        probs[:, mask_token_id] = 0.0
        self.register_buffer("log_probs", probs.clamp_min(1e-30).log())

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, positions=None,
                kv=None, rows: tuple[int, int] | None = None) -> Tensor:
        batch, length = input_ids.shape
        gen = self.log_probs.shape[0]
        logits = torch.zeros(batch, length, self.vocab_size)
        logits[:, length - gen:] = self.log_probs
        a, b = rows if rows is not None else (0, length)
        return logits[:, a:b]


def tiny_tokenizer(vocab_size: int = 37):
    """Word-level tokenizer for `tiny_llada`: `[UNK]`, w1 … w{V-3}, `<|endoftext|>`, `<|mdm_mask|>`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, vocab_size - 2)},
             "<|endoftext|>": vocab_size - 2, "<|mdm_mask|>": vocab_size - 1}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]",
                                   eos_token="<|endoftext|>", mask_token="<|mdm_mask|>")


def tiny_llada_with_tokenizer(seed: int = 0) -> LLaDAModelLM:
    """`tiny_llada` with `tiny_tokenizer` attached: the CLI's `--model tiny` (decodes noise)."""
    model = tiny_llada(seed)
    model.tokenizer = tiny_tokenizer(model.vocab_size)
    model.name_or_path = "tiny"
    return model
