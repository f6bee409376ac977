"""What a `DRAFTERS` entry is: a frozen dataclass of the drafter's options that builds the
drafter for one target (`DraftSpec.build`), and what building may use besides (`DraftContext`).

A scheduler needs nothing but its options; a drafter also needs the target it drafts for (a
layer-skip draft takes the target's layers, every draft must share its vocabulary), the device
a draft model loads on and the run-wide choices of the command line (draft runtime, token-tree
shape, a diffusion draft's unmasking scheduler). The options are the entry's fields, so
`registry.build(DRAFTERS, name, options)` and `registry.component("drafter", ...)` read them as
they read a scheduler's; the rest is the `DraftContext` given to `build`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from dllm_decode.fields import Checked
from dllm_decode.interfaces import Scheduler
from dllm_decode.speculative.drafters.base import Drafter
from dllm_decode.speculative.tree import TreeShape


@dataclass(frozen=True)
class DraftContext:
    """What a drafter is built for, besides its own options.

    Attributes:
        target: the target as transformers loaded it (layer skipping takes its modules; every
            draft must share its vocabulary).
        device: where a draft model is loaded.
        runtime: how a causal-LM or layer-skip draft runs (`hf`, `compact`, `auto`).
        unmasking: a `dllm` draft's unmasking scheduler (None: the threshold rule at 0.9).
        drop_text: text whose tokens a `dllm` draft removes from the context.
        tree: the token-tree shape of drafters that can draft trees (model, layer skip,
            lookup, staged); None drafts chains.
    """

    target: Any
    device: Any = None
    runtime: str = "auto"
    unmasking: Scheduler | None = None
    drop_text: str = ""
    tree: TreeShape | None = None


class Built(NamedTuple):
    """A built drafter (None: plain AR) and the transformers model it drafts with, if any (a
    staged drafter's second stage sees that model as its target)."""

    drafter: Drafter | None
    source: Any


class DraftSpec(Checked, abc.ABC):
    """A `DRAFTERS` entry: a frozen dataclass whose fields are the drafter's options, every field
    defaulted and type-checked (`dllm_decode.fields`), ranges checked in `__post_init__`.
    `drafts_trees`: whether the built drafter can draft a token tree (`DraftContext.tree`)."""

    drafts_trees: ClassVar[bool] = False

    @abc.abstractmethod
    def build(self, context: DraftContext) -> Built:
        """The drafter for `context.target`.

        Raises:
            ValueError: an option that does not fit the target, a draft that does not share the
                target's vocabulary, or (`ModelLoadError`) a draft model that cannot be loaded.
        """


@dataclass(frozen=True)
class NoDraft(DraftSpec):
    """Plain autoregressive decoding: the target alone, one token per forward."""

    def build(self, context: DraftContext) -> Built:
        return Built(None, None)


def same_vocabulary(target: Any, size: int) -> None:
    """Raise a one-line ValueError unless a draft of vocabulary `size` shares the target's."""
    if int(target.config.vocab_size) != int(size):
        raise ValueError(f"the draft must share the target's tokenizer; vocabulary sizes differ "
                         f"({size} vs {target.config.vocab_size})")
