"""Drafters and draft-length rules are ordinary registries: frozen dataclasses of options built by
`registry.build`, staged drafting as nested fields, and the short `--draft` spellings read into
the same entries."""

from __future__ import annotations

import dataclasses

import pytest

from dllm_decode.registry import build, component, component_dict, registry
from dllm_decode.speculative import (DRAFT_LENGTHS, DRAFTERS, BildScheduler, DraftContext, DraftSpec,
                                     HeuristicScheduler, LookupDraft, LookupDrafter, ModelDrafter,
                                     StagedDrafter, TreeShape, draft_spec, make_drafter)
from dllm_decode.speculative.drafters import LayerSkipDraft, ModelDraft, NoDraft, StagedDraft
from tests.speculative.conftest import tiny_llama


def test_registries_are_found_by_kind():
    assert registry("drafter") is DRAFTERS and registry("draft_length") is DRAFT_LENGTHS
    assert DRAFT_LENGTHS == {"heuristic": HeuristicScheduler, "bild": BildScheduler}


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_every_drafter_entry_is_a_frozen_dataclass_of_options(name):
    cls = DRAFTERS[name]
    assert issubclass(cls, DraftSpec) and dataclasses.is_dataclass(cls)
    assert cls.__dataclass_params__.frozen
    for f in dataclasses.fields(cls):
        assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    if name == "layerskip":            # no default layer set: the target decides what exists
        return
    spec = cls()
    assert component("drafter", component_dict(spec)) == spec        # the JSON round trip


@pytest.mark.parametrize("text,expected", [
    ("none", NoDraft()),
    ("lookup", LookupDraft()),
    ("lookup:3", LookupDraft(max_ngram=3)),
    ("layerskip:2", LayerSkipDraft("2")),
    ("layerskip:0,2", LayerSkipDraft("0,2")),
    ("dllm", DRAFTERS["dllm"]()),
    ("dllm:embedded", DRAFTERS["dllm"]("embedded")),
    ("ar_draft", ModelDraft("ar_draft")),
    ("/some/dir", ModelDraft("/some/dir")),
    ("staged:ar_draft>lookup:3", StagedDraft(ModelDraft("ar_draft"), LookupDraft(3))),
    ("staged:ar_draft>layerskip:1>lookup",
     StagedDraft(ModelDraft("ar_draft"), StagedDraft(LayerSkipDraft("1"), LookupDraft()))),
])
def test_short_spellings_read_into_registry_entries(text, expected):
    assert draft_spec(text) == expected


def test_staged_stages_are_nested_fields_with_dotted_options():
    spec = build(DRAFTERS, "staged", {"first": "layerskip", "first.layers": "1",
                                      "second": "lookup", "second.max_ngram": "4"})
    assert spec == StagedDraft(LayerSkipDraft("1"), LookupDraft(max_ngram=4))
    assert draft_spec("staged", {"second.min_ngram": "2"}) == StagedDraft(second=LookupDraft(min_ngram=2))
    assert draft_spec("staged:ar_draft>lookup", {"second.max_ngram": 5}).second == LookupDraft(5)
    assert component("drafter", component_dict(spec)) == spec


@pytest.mark.parametrize("spec,match", [
    ({"name": "lookup", "max_ngram": "x"}, "max_ngram"),
    ({"name": "lookup", "min_ngram": 0}, "min_ngram"),
    ({"name": "lookup", "width": 3}, "unknown option 'width'"),
    ({"name": "nope"}, "unknown drafter 'nope'"),
    ({"name": "staged", "first": "lookup"}, "first stage"),
    ({"name": "staged", "second": "none"}, "cannot be `none`"),
    ({"name": "layerskip", "layers": "a"}, "layerskip expects N"),
    ("none:1", "takes no argument"),
    ("", "the draft is empty"),
])
def test_bad_drafter_options_are_one_line_errors(spec, match):
    with pytest.raises(ValueError, match=match) as err:
        draft_spec(spec)
    assert "\n" not in str(err.value)


def test_building_for_a_target_gives_the_same_drafters_as_before():
    target = tiny_llama(0)
    tree = TreeShape(2, 6)
    context = DraftContext(target, None, "hf", tree=tree)
    assert make_drafter("none", context) == (None, None)
    lookup, source = make_drafter("lookup:3", context)
    assert isinstance(lookup, LookupDrafter) and (lookup.max_ngram, lookup.tree) == (3, tree)
    assert source is None
    skip, source = make_drafter({"name": "layerskip", "layers": "1"}, context)
    assert isinstance(skip, ModelDrafter) and skip.tree == tree
    assert len(source.model.layers) == 1 and source.model.layers[0] is target.model.layers[0]
    staged, _ = make_drafter("staged", context, {"first": "layerskip", "first.layers": "2",
                                                  "second": "layerskip", "second.layers": "1"})
    assert isinstance(staged, StagedDrafter) and isinstance(staged.second, ModelDrafter)
    # the second stage skips layers of the first stage's model, not of the target
    assert len(staged.second.model.model.layers) == 1
    with pytest.raises(ValueError, match="layer"):
        make_drafter("layerskip:3", context)              # all three layers: nothing skipped
