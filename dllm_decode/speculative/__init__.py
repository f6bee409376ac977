"""Autoregressive speculative decoding behind the diffusion loop's scheduler interface.

A drafter (`DRAFTERS`: small causal LM, prompt lookup, the target with layers skipped, a masked
diffusion LM drafting a block in parallel, or a staged drafter whose own drafting is speculated)
proposes a chain or a token tree; a `Scheduler` (the same objects the diffusion loop uses, plus
the AR-only `heuristic` and `bild` of `DRAFT_LENGTHS`) decides how many levels to verify; the
target verifies them in one forward (a tree under a tree mask), greedily (identical to its own
greedy output) or by (recursive) speculative sampling (identical in distribution); BiLD's
rollback is the one lossy option. Batch size 1. See `schedule.py` for how each scheduler maps,
and `compact.py` for the lean runtime drafts use by default (transformers' per-layer dispatch
dominates at small sizes). Causal LMs load with `dllm_decode.models.causal.load_causal_lm`.
"""

from dllm_decode.speculative.compact import RUNTIMES, CompactCausalLM, with_runtime
from dllm_decode.speculative.draft_lengths import (DRAFT_LENGTHS, BildScheduler, DraftLengthScheduler,
                                                   HeuristicScheduler)
from dllm_decode.speculative.drafters import (DRAFTERS, DiffusionDraft, DiffusionDrafter, Draft,
                                              DraftContext, Drafter, DraftSpec, LayerSkipDraft,
                                              LookupDraft, LookupDrafter, ModelDraft, ModelDrafter,
                                              NoDraft, StagedDraft, StagedDrafter, draft_spec,
                                              layer_subset, layerskip_drafter, make_drafter)
from dllm_decode.speculative.loop import SpecConfig, SpecResult, eos_ids_of, speculative_generate
from dllm_decode.speculative.sampling import Sampling
from dllm_decode.speculative.schedule import check_scheduler, draft_length, draft_length_rule
from dllm_decode.speculative.tree import TreeShape
from dllm_decode.speculative.verify import greedy_verify, speculative_verify

__all__ = ["DRAFTERS", "DRAFT_LENGTHS", "RUNTIMES", "BildScheduler", "CompactCausalLM",
           "DiffusionDraft", "DiffusionDrafter", "Draft", "DraftContext", "DraftLengthScheduler",
           "DraftSpec", "Drafter", "HeuristicScheduler", "LayerSkipDraft", "LookupDraft",
           "LookupDrafter", "ModelDraft", "ModelDrafter", "NoDraft", "Sampling", "SpecConfig",
           "SpecResult", "StagedDraft", "StagedDrafter", "TreeShape", "check_scheduler", "draft_spec",
           "draft_length", "draft_length_rule", "eos_ids_of", "greedy_verify", "layer_subset",
           "layerskip_drafter", "make_drafter", "speculative_generate", "speculative_verify",
           "with_runtime"]
