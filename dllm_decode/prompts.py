"""Prompt encoding and the left-padded canvas `[padding][prompt][MASK x G]`, and the one check
every entry point (Python API, CLI, batch files, the server) runs on a prompt:

- text (`check_text`): valid Unicode (no lone surrogates) and no special token of the tokenizer
  written out (`[MASK]`-style tokens, end-of-text, padding): a prompt is text, and special tokens
  typed into it would steer the decode (a [MASK] is decoded, an end-of-text ends the answer);
- token ids (`check_token_ids`): Python or numpy integers only (never `True`, `5.7` or `"5"`),
  inside the vocabulary, never the [MASK] id;
- unknown words (`unknown_words`, `unknown_words_warning`): words the tokenizer maps to its
  unknown token carry no meaning for the model: a one-line warning, not an error.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from dllm_decode.notices import UnknownWordsWarning


def encode_prompts(prompts: Sequence[str] | Sequence[Sequence[int]], tokenizer: Any,
                   vocab_size: int | None = None, mask_id: int | None = None) -> list[list[int]]:
    """B prompts (strings or token-id lists) -> B non-empty token-id lists.

    Raises:
        TypeError: prompts that are not a list of strings or of integer sequences.
        ValueError: no prompts, an empty prompt, strings without a tokenizer, a token id outside
            `[0, vocab_size)`, or the [MASK] id inside a prompt.
    """
    if isinstance(prompts, Tensor):
        if prompts.dim() != 2 or prompts.dtype.is_floating_point:
            raise TypeError(f"a prompt tensor must be (B, P) integer ids, got {prompts.dtype} "
                            f"{tuple(prompts.shape)}")
        prompts = prompts.tolist()
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of strings or token-id lists, got "
                        f"{type(prompts).__name__} (wrap a single prompt in a list)")
    if not len(prompts):
        raise ValueError("prompts must be a non-empty list of strings or token-id lists")
    ids: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            check_text(prompt, tokenizer, f"prompt {i}", only_mask=True)   # may be templated
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer (the model ships none): pass token ids")
            row = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt.strip() else []
            warning = unknown_words_warning(tokenizer, prompt, row, f"prompt {i}")
            if warning:
                warnings.warn(warning, UnknownWordsWarning, stacklevel=3)
        elif isinstance(prompt, (Sequence, Tensor)) and not isinstance(prompt, bytes):
            row = list(check_token_ids(prompt.tolist() if isinstance(prompt, Tensor) else prompt,
                                       where=f"prompt {i}"))
        else:
            raise TypeError(f"prompt {i} must be a string or a list of token ids, got "
                            f"{'None' if prompt is None else type(prompt).__name__}")
        if not row:
            raise ValueError(f"prompt {i} is empty")
        if vocab_size is not None and not all(0 <= t < vocab_size for t in row):
            bad = next(t for t in row if not 0 <= t < vocab_size)
            raise ValueError(f"prompt {i} holds token id {bad}, outside the vocabulary [0, {vocab_size})")
        if mask_id is not None and mask_id in row:
            raise ValueError(f"prompt {i} holds the [MASK] id {mask_id}; prompts must be clean text "
                             f"(the loop decodes only the generation region)")
        ids.append(row)
    return ids


def check_text(text: Any, tokenizer: Any = None, where: str = "the prompt", only_mask: bool = False) -> str:
    """A prompt's text, checked: a `str` of valid Unicode with no special token of `tokenizer`
    written out in it. Run it on the user's text, before any chat template (templates add their
    own special tokens); on text that may already be templated, `only_mask` checks for the mask
    token alone (no template writes one).

    Raises:
        TypeError: not a string.
        ValueError: a lone surrogate (names the character position), or a special token such as
            the tokenizer's [MASK] or end-of-text (names the token).
    """
    if not isinstance(text, str):
        raise TypeError(f"{where} must be text, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{where} is not valid text: {text[err.start]!r} at character {err.start} "
                         f"is a lone surrogate (no Unicode character)") from None
    mask = getattr(tokenizer, "mask_token", None)
    for token in ((mask,) if only_mask and isinstance(mask, str) and mask.strip() else
                  () if only_mask else special_tokens(tokenizer)):
        if token in text:
            raise ValueError(f"{where} holds the special token {token!r}; prompts are plain text "
                             f"(special tokens are the tokenizer's and the loop's to place)")
    return text


def special_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's special tokens as text (mask, end-of-text, padding, unknown, added
    control tokens), longest first; none without a tokenizer."""
    if tokenizer is None:
        return ()
    found: set[str] = set()
    for token in getattr(tokenizer, "all_special_tokens", None) or ():
        if isinstance(token, str) and token.strip():
            found.add(token)
    for name in ("mask_token", "eos_token", "pad_token", "bos_token"):
        token = getattr(tokenizer, name, None)
        if isinstance(token, str) and token.strip():
            found.add(token)
    return tuple(sorted(found, key=len, reverse=True))


def check_token_ids(ids: Any, vocab_size: int | None = None, mask_id: int | None = None,
                    where: str = "the prompt") -> tuple[int, ...]:
    """Token ids, checked: a sequence (list, tuple, 1-d tensor or array) of integers (Python or
    numpy ints; never a bool, a float such as 5.7 or a string such as "5"), each >= 0, inside
    `[0, vocab_size)` when given, and never `mask_id`. Returns them as a tuple of Python ints.

    Raises:
        TypeError: not a sequence, or an element that is not an integer (named with its index).
        ValueError: a negative id, one outside the vocabulary, or the [MASK] id.
    """
    if isinstance(ids, Tensor):
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise TypeError(f"{where}: a token-id tensor must be 1-d integers, got {ids.dtype} "
                            f"{tuple(ids.shape)}")
        ids = ids.tolist()
    if isinstance(ids, (str, bytes, bytearray)) or not hasattr(ids, "__iter__") or hasattr(ids, "keys"):
        raise TypeError(f"{where} must be a list of token ids (integers), got {type(ids).__name__}")
    out = []
    for k, value in enumerate(ids):
        if isinstance(value, bool) or not hasattr(value, "__index__") or isinstance(value, Tensor):
            raise TypeError(f"{where} holds {value!r} at index {k}; token ids must be integers")
        token = int(value)
        if token < 0 and vocab_size is None:
            raise ValueError(f"{where} holds token id {token} at index {k}, outside the vocabulary (ids are >= 0)")
        if vocab_size is not None and not 0 <= token < vocab_size:
            raise ValueError(f"{where} holds token id {token}, outside the vocabulary [0, {vocab_size})")
        if mask_id is not None and token == mask_id:
            raise ValueError(f"{where} holds the [MASK] id {mask_id}; prompts must be clean text "
                             f"(the loop decodes only the generation region)")
        out.append(token)
    return tuple(out)


def unknown_words(tokenizer: Any, text: str, ids: Sequence[int] | None = None) -> list[str]:
    """The pieces of `text` the tokenizer encodes as its unknown token (in order, each once);
    empty when it has no unknown token or knows every word. Pieces the tokenizer's chat template
    writes itself (its markup, on a templated prompt) are not the user's words and are left out."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if tokenizer is None or unk is None or not text.strip():
        return []
    if ids is not None and unk not in ids:
        return []
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        pairs = zip(encoded["input_ids"], encoded["offset_mapping"])
        words = [text[a:b] for token, (a, b) in pairs if token == unk]
    except (NotImplementedError, KeyError, TypeError, ValueError):   # slow tokenizers: no offsets
        words = [w for w in text.split() if unk in tokenizer(w, add_special_tokens=False)["input_ids"]]
    template = getattr(tokenizer, "chat_template", None)
    markup = template if isinstance(template, str) else ""     # what the template writes is not the user's
    return list(dict.fromkeys(w for w in words if w.strip() and w.strip() not in markup))


def unknown_words_warning(tokenizer: Any, text: str, ids: Sequence[int] | None = None,
                          where: str = "the prompt") -> str | None:
    """One line naming the words of `text` the tokenizer does not know, or None."""
    words = unknown_words(tokenizer, text, ids)
    if not words:
        return None
    shown = ", ".join(repr(w) for w in words[:5]) + (f" and {len(words) - 5} more" if len(words) > 5 else "")
    unk = getattr(tokenizer, "unk_token", None) or "the unknown token"
    return (f"{where} has {len(words)} word(s) the tokenizer does not know ({shown}); they become "
            f"{unk} and carry no meaning for the model")


def left_pad(ids: list[list[int]], gen_length: int, mask_id: int, pad_id: int,
             device: torch.device) -> tuple[Tensor, Tensor | None]:
    """(B, P + G) canvas with prompts right-aligned at column P, and its attention mask.

    The mask is None when no row is padded, so the model takes its unmasked fast path.
    """
    width = max(len(row) for row in ids)
    canvas = torch.full((len(ids), width + gen_length), mask_id, dtype=torch.long)
    mask = torch.ones_like(canvas)
    for b, row in enumerate(ids):                     # host-side setup, once per call
        canvas[b, :width - len(row)] = pad_id
        canvas[b, width - len(row):width] = torch.tensor(row)
        mask[b, :width - len(row)] = 0
    padded = any(len(row) < width for row in ids)
    return canvas.to(device), (mask.to(device) if padded else None)


def chat_prompt(tokenizer: Any, prompt: str, enabled: bool = True) -> str:
    """`prompt` as one user turn in the tokenizer's chat template, ready for the answer (the
    form instruction-tuned checkpoints were trained on); unchanged when `enabled` is off or the
    tokenizer has no template. Every command, eval, spec and the lm-eval adapter wrap prompts
    here, so this is where the user's text gets the full `check_text`.

    Raises:
        ValueError: text `check_text` refuses.
    """
    check_text(prompt, tokenizer)
    if not enabled or tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return prompt
    return render_chat(tokenizer, [{"role": "user", "content": prompt}])


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The messages in the tokenizer's chat template, ready for the answer.

    A template is the checkpoint's own code (jinja2, sandboxed by transformers): one that raises
    (`raise_exception`), is stopped by the sandbox, loops too deep or renders no text is a
    one-line error, not a traceback.

    Raises:
        ValueError: naming the template's failure and the way around it.
    """
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except RecursionError:
        raise ValueError("the model's chat template recursed too deeply; decode without it "
                         "(--no-chat-template)") from None
    except Exception as err:  # noqa: BLE001 - a template raises what its author wrote (or jinja2's errors)
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"the model's chat template failed ({type(err).__name__}: {reason[:200]}); "
                         f"decode without it (--no-chat-template)") from None
    if not isinstance(text, str):
        raise ValueError(f"the model's chat template rendered {type(text).__name__}, not text; decode "
                         f"without it (--no-chat-template)")
    return text

