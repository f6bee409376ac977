"""A test DiffusionLM that knows the answer of each prompt it is built with (runner tests)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dllm_decode.eval.tasks.tokenizer import load_tokenizer


class AnswerKeyModel(nn.Module):
    """Puts probability `confidence` on the keyed answer's token at each generated position (EOS
    after the answer, uniform rest), for canvases of `gen_length` generated tokens.

    Prompts not in the key get a confident EOS everywhere (an empty, wrong answer).
    """

    supports_kv = False

    def __init__(self, answers: dict[str, str], gen_length: int, confidence: float = 0.9):
        super().__init__()
        self.tokenizer = load_tokenizer()
        self.mask_token_id = self.tokenizer.mask_token_id
        self.eos_token_ids = (self.tokenizer.eos_token_id,)
        self.vocab_size, self.max_length = len(self.tokenizer), None
        self.gen_length, self.confidence = gen_length, confidence
        encode = lambda text: tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        self.key = {encode(prompt): encode(answer) for prompt, answer in answers.items()}
        self.pad_id = self.tokenizer.pad_token_id

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, positions=None,
                kv=None, rows: tuple[int, int] | None = None) -> Tensor:
        batch, length = input_ids.shape
        rest = (1 - self.confidence) / (self.vocab_size - 2)
        probs = torch.full((batch, length, self.vocab_size), rest)
        for b in range(batch):
            prompt = input_ids[b, :length - self.gen_length]
            if attention_mask is not None:
                prompt = prompt[attention_mask[b, :length - self.gen_length].bool()]
            answer = self.key.get(tuple(prompt.tolist()), ())
            target = list(answer)[:self.gen_length]
            target += [self.eos_token_ids[0]] * (self.gen_length - len(target))
            cols = torch.arange(length - self.gen_length, length)
            probs[b, cols, torch.tensor(target)] = self.confidence
        probs[..., self.mask_token_id] = 0.0
        logits = probs.clamp_min(1e-30).log()
        a, z = rows if rows is not None else (0, length)
        return logits[:, a:z]
