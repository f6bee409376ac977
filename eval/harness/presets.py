"""Tuned decoding presets: named combinations of the published policies with tuned settings.

The registered schedulers, caches and filters keep their papers' defaults; a preset is a
documented deviation chosen on this repository's task suite and embedded model with
`dllm-decode bench` (tuned on test examples of seed 1, reported on seed 0; see each `why`).
A preset is a partial decode record (the `DecodeConfig.from_dict` form, without lengths):
`PRESETS[name].config(gen_length=256, block_length=32)`.

`dllm-decode tune` writes tuned presets to a `presets.json` (one per task plus `overall`, each with
the model it was tuned on); `find_preset("FILE:NAME", model)` loads one and refuses it for another
model, `find_preset("NAME")` is a hand-written one (or an entry of `$DLLM_DECODE_PRESETS`).
`--preset` on `dllm-decode` (one prompt or a requests file), `eval` and `serve`, `generate(...,
preset=...)` and the server's `--presets` all go through `find_preset` / `tuned_presets`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dllm_decode.config import DecodeConfig


@dataclass(frozen=True)
class Preset:
    """A named partial decode record.

    Attributes:
        parts: `DecodeConfig.from_dict` keys this preset fixes (scheduler, cache, filters).
        why: what was measured to choose it.
    """

    parts: dict[str, Any] = field(default_factory=dict)
    why: str = ""

    def __post_init__(self) -> None:
        check_parts(self.parts)

    def build_self_decoder(self) -> Any:
        """The self-speculative decoder a tuned preset decodes with (its `self_decoder` part, a
        `SelfDecoder`), or None: the denoising loop. Not a `DecodeConfig` part: the preset's
        scheduler is its base rule."""
        return _self_decoder_of(self.parts)

    def config(self, **fields: Any) -> DecodeConfig:
        """The full record: the preset's parts plus `fields` (gen_length, block_length, ...). A
        tuned fixed-count preset's `tokens_per_step` becomes `steps_per_block` on the block."""
        return _record(self.parts, fields)


def _record(parts: dict[str, Any], fields: dict[str, Any]) -> DecodeConfig:
    parts = {**parts, **fields}
    parts.pop("self_decoder", None)                 # decodes the record; not part of it
    k = parts.pop("tokens_per_step", None)
    if k is not None:
        block = parts.get("block_length") or parts.get("gen_length", 1)
        parts["scheduler"] = {**parts["scheduler"], "steps_per_block": math.ceil(block / int(k))}
    return DecodeConfig.from_dict(parts)


def _self_decoder_of(parts: dict[str, Any]) -> Any:
    from dllm_decode.registry import component

    value = parts.get("self_decoder")
    return None if value is None else component("self_decoder", value)


def check_parts(parts: Any) -> None:
    """Check a preset's own fields as one record, whatever a command line later overrides (a
    broken preset is refused wherever it is used, not only where its broken field survives).

    Raises:
        ValueError: naming the preset field and what is accepted.
    """
    if not isinstance(parts, dict):
        raise ValueError(f"a preset's parts must be an object, got {type(parts).__name__}")
    k = parts.get("tokens_per_step")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"preset tokens_per_step must be an integer >= 1, got {k!r}")
    if k is not None and not isinstance(parts.get("scheduler"), dict):
        raise ValueError("preset tokens_per_step needs its scheduler as an object with `name`")
    block = parts.get("block_length")
    own = {} if "gen_length" in parts else {"gen_length": block if isinstance(block, int) and
                                            not isinstance(block, bool) and block >= 1 else 32}
    try:
        _record(parts, own)
        _self_decoder_of(parts)
    except RecursionError:
        raise ValueError("a preset is nested too deeply") from None
    except (ValueError, TypeError) as err:
        raise ValueError(f"preset: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}") from None


EOTP = [{"name": "eotp"}]
_TUNING = ("chosen from hand sweeps of each field through dllm_decode.eval.bench on 4 test examples "
           "per target task (seed 1), gen 256, block 32, embedded model ff4b214 (the sweep script "
           "was not kept; `dllm-decode bench stack` re-measures the chosen presets)")

PRESETS: dict[str, Preset] = {
    # EB-sampler with a 100x looser entropy budget, plus EoTP. On the embedded model at gen 256,
    # truncating after the committed end of text also *raises* accuracy (the model saw long masked
    # tails rarely in training: 21 -> 36% for threshold), and gamma 0.1 keeps EB's accuracy
    # (seed 1: NFE 4.43 vs 6.68 at gamma 0.01, accuracy 39% vs 21% for one token per step).
    "eb_eotp": Preset({"scheduler": {"name": "eb", "gamma": 0.1}, "filters": EOTP}, why=_TUNING),
    # Fast-dLLM threshold lowered to 0.8 with EoTP: NFE 3.93 (1.75x the oracle) at +10.7 points
    # over one token per step on seed 1; 0.7 lost accuracy (-3.6), 0.6 more (-7.1).
    "threshold_0.8_eotp": Preset({"scheduler": {"name": "threshold", "threshold": 0.8},
                                  "filters": EOTP}, why=_TUNING),
    # Fast-dLLM factor rule at f = 1.5 with EoTP: the fewest steps that kept the mean (NFE 3.11,
    # 1.38x the oracle, +0.0 points on seed 1) but it loses Sudoku (-50 points on 4 examples).
    "factor_1.5_eotp": Preset({"scheduler": {"name": "factor", "factor": 1.5}, "filters": EOTP},
                              why=_TUNING),
}


MODEL_KEYS = ("config_sha256", "weights_sha256")
PRESETS_ENV = "DLLM_DECODE_PRESETS"
"""An environment variable naming a tuned presets file whose entries `--preset NAME` also finds."""
MAX_PRESETS_BYTES = 1 << 20
"""The largest presets file read (a tuned file for 12 tasks is about 20 kB)."""
PRESET_HELP = ("A decoding preset: a hand-written NAME, a `dllm-decode tune` presets.json FILE (its `overall`) "
               "or FILE:NAME (a task's); NAME alone also looks in the file $DLLM_DECODE_PRESETS names. "
               "It sets the scheduler, cache, filters and the block length it was tuned at.")


def model_identity(spec_text: str, directory: Path | None) -> dict[str, str]:
    """The model a preset is tuned on: its name and, for a checkpoint directory, the SHA-256 of
    `config.json` and of the weights (`*.safetensors`, sorted by name)."""
    identity = {"name": spec_text}
    if directory is not None and (directory / "config.json").is_file():
        identity["config_sha256"] = _stream_hash([directory / "config.json"])
        identity["weights_sha256"] = _stream_hash(sorted(directory.glob("*.safetensors")))
    return identity


HASH_CHUNK = 1 << 20


def _stream_hash(paths: list[Path]) -> str:
    """SHA-256 of the files' bytes in order, read in 1 MiB chunks (a 16 GB checkpoint is hashed
    in constant memory)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            while chunk := handle.read(HASH_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def identity_of(spec: Any) -> dict[str, str]:
    """`model_identity` of a parsed `--model` (a `ModelSpec`): hashes for a checkpoint directory
    (the shipped embedded models included), the name alone otherwise (`ideal`, `tiny`)."""
    directory = None
    if getattr(spec, "kind", None) == "diffusion":
        from dllm_decode.models.checkpoint import resolve_model_dir

        try:
            directory = resolve_model_dir(spec.name)
        except (ValueError, OSError):
            directory = None
    return model_identity(str(spec), directory)


def _read(path: Path) -> dict[str, Any]:
    """A tuned presets document: a regular JSON file of at most `MAX_PRESETS_BYTES` (parsed as
    JSON, nothing else), with a `presets` object whose entries each have `parts.scheduler`."""
    where = str(path)
    if not path.is_file():
        raise ValueError(f"preset file {where} does not exist or is not a regular file")
    if path.stat().st_size > MAX_PRESETS_BYTES:
        raise ValueError(f"preset file {where} is larger than {MAX_PRESETS_BYTES} bytes; a tuned presets.json is "
                         f"a few kB")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{where} is not a tuned presets file (dllm-decode tune's presets.json): "
                         f"not JSON ({str(err).splitlines()[0]})") from None
    except RecursionError:
        raise ValueError(f"{where} is not a tuned presets file: its JSON is nested too deeply") from None
    entries = document.get("presets") if isinstance(document, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise ValueError(f"{where} is not a tuned presets file (dllm-decode tune's presets.json): no `presets` object")
    for name, entry in entries.items():
        parts = entry.get("parts") if isinstance(entry, dict) else None
        if not isinstance(parts, dict) or not isinstance(parts.get("scheduler"), (dict, str)):
            raise ValueError(f"{where}: preset {name!r} has no `parts` with a scheduler")
    return document


def load_tuned(path: str | Path) -> dict[str, Preset]:
    """The presets of a `dllm-decode tune` output file, by name (each task's, and `overall`)."""
    path = Path(path)
    document = _read(path)
    model = document.get("model") if isinstance(document.get("model"), dict) else {}
    out: dict[str, Preset] = {}
    for name, entry in document["presets"].items():
        try:
            out[name] = Preset(dict(entry["parts"]), why=f"tuned by dllm-decode tune on {model.get('name', '?')} "
                                                        f"({document.get('budget', '?')}); {path}")
        except ValueError as err:
            raise ValueError(f"{path}: preset {name!r}: {str(err).removeprefix('preset: ')}") from None
    return out


def check_model(recorded: dict[str, Any], model: dict[str, str], what: str) -> None:
    """Refuse, in one line, a preset tuned on another model: the weights and config hashes where
    both sides have them, else the model names."""
    shared = [key for key in MODEL_KEYS if key in recorded and key in model]
    for key in shared:
        if recorded[key] != model[key]:
            raise ValueError(f"{what} was tuned on another model ({key} differs from {model.get('name', 'this one')}'s); "
                             f"re-run dllm-decode tune for it")
    if not shared and recorded.get("name") not in (None, model.get("name")):
        raise ValueError(f"{what} was tuned on {recorded.get('name')}, not {model.get('name')}; re-run dllm-decode "
                         f"tune for it")


def tuned_presets(path: str | Path, model: dict[str, str] | None = None) -> dict[str, Preset]:
    """Every preset of a tuned file, checked against `model` (the server's per-request choices)."""
    presets = load_tuned(path)
    if model is not None:
        check_model(_read(Path(path)).get("model") or {}, model, f"the presets in {path}")
    return presets


def find_preset(text: str, model: dict[str, str] | None = None) -> Preset:
    """`NAME` (a hand-written preset, else an entry of the file `$DLLM_DECODE_PRESETS` names),
    `FILE` (a tuned presets.json: its `overall`) or `FILE:NAME` (a tuned one). With `model`
    (`identity_of` the loaded model), a tuned preset recorded for another model is refused in
    one line. Files are read as JSON only, never unpickled."""
    if text in PRESETS:
        return PRESETS[text]
    if not text or len(text) > 4096 or "\x00" in text:
        raise ValueError(f"unknown preset {text[:80]!r}; known: {', '.join(sorted(PRESETS))}, FILE or FILE:NAME")
    if text.endswith(".json") and Path(text).is_file():
        path, name = text, "overall"
    else:
        path, sep, name = text.rpartition(":")
        if not sep or not path:
            path, name = os.environ.get(PRESETS_ENV, ""), text
            if not path:
                raise ValueError(f"unknown preset {text!r}; known: {', '.join(sorted(PRESETS))}, or FILE / FILE:NAME "
                                 f"for a tuned presets.json (or set {PRESETS_ENV} to one)")
    tuned = load_tuned(path)
    if name not in tuned:
        raise ValueError(f"{path} has no preset {name!r}; it has {', '.join(sorted(tuned))}")
    if model is not None:
        check_model(_read(Path(path)).get("model") or {}, model, f"preset {name!r} in {path}")
    return tuned[name]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _flat(spec: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """A component dict's fields as the eval grid's text options (dotted for a wrapper's base)."""
    out: list[tuple[str, str]] = []
    for key, value in spec.items():
        if key == "name" and not prefix:
            continue
        if isinstance(value, dict):
            out += [(f"{prefix}{key}.name", _text(value.get("name")))] if "name" in value else []
            out += _flat({k: v for k, v in value.items() if k != "name"}, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", _text(value)))
    return out


def preset_setting(preset: Preset, *, gen_length: int | None, block_length: int | None, temperature: float = 0.0,
                   seed: int = 0) -> Any:
    """The eval grid's `Setting` of a preset (one point of `dllm-decode eval --preset`): its
    scheduler, cache and filters, the block length it fixes unless `block_length` is given."""
    from dllm_decode.eval.harness.grid import Setting

    parts = preset.parts
    scheduler = parts["scheduler"] if isinstance(parts["scheduler"], dict) else {"name": parts["scheduler"]}
    options = _flat(scheduler)
    if "tokens_per_step" in parts:
        options.append(("tokens_per_step", str(int(parts["tokens_per_step"]))))
    cache = parts.get("cache") or {"name": "none"}
    cache = cache if isinstance(cache, dict) else {"name": cache}
    filters = tuple((f["name"], tuple(sorted(_flat(f)))) if isinstance(f, dict) else (f, ())
                    for f in parts.get("filters") or ())
    block = block_length if block_length is not None else parts.get("block_length")
    own = parts.get("self_decoder") or {"name": "none"}
    own = own if isinstance(own, dict) else {"name": own}
    return Setting(scheduler=scheduler["name"], options=tuple(options), cache=cache["name"],
                   cache_options=tuple(sorted(_flat(cache))), filters=filters, gen_length=gen_length,
                   block_length=None if gen_length is None else block, temperature=temperature, seed=seed,
                   self_decoder=own["name"], self_decoder_options=tuple(sorted(_flat(own))))


def preset_config(text: str, model: dict[str, str] | None = None, **fields: Any) -> DecodeConfig:
    """The API's `--preset`: `find_preset(text, model).config(**fields)`, e.g.
    `generate(model, prompts, preset_config("runs/tune/presets.json:shuffle", identity_of(spec),
    gen_length=256))`; the preset's block length stands unless `fields` give one."""
    preset = find_preset(text, model)
    return preset.config(**fields)
