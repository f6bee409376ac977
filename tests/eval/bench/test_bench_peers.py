"""Peers' reference loops through their wrappers: stand-in checkouts written here (the peers'
real signatures, a tiny behaviour: this project's own loop underneath), and, opt-in, a real
Fast-dLLM checkout named by DLLM_DECODE_PEER_FAST_DLLM."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from dllm_decode.eval.bench.peers import checkout_commit, loops_in, parse_peer
from dllm_decode.eval.bench.shaped import ShapedOptions, run_shaped

V1_GENERATE = '''
import json, pathlib
import torch
from model.modeling_llada import LLaDAModelLM      # the real file imports its model package too

CALLS = pathlib.Path(__file__).with_name("calls.json")


def generate_with_dual_cache(model, prompt, steps=128, gen_length=128, block_length=128, temperature=0.,
                             remasking='low_confidence', mask_id=126336, threshold=None):
    from dllm_decode import DecodeConfig, generate
    from dllm_decode.caches import DualCache
    from dllm_decode.schedulers import LowConfidenceScheduler

    assert isinstance(model, LLaDAModelLM)
    CALLS.write_text(json.dumps(dict(steps=steps, gen_length=gen_length, block_length=block_length,
                                     temperature=temperature, remasking=remasking, mask_id=mask_id,
                                     threshold=threshold, prompt=list(prompt.shape))))
    per_block = steps // (gen_length // block_length)
    result = generate(model, prompt.tolist(), DecodeConfig(
        scheduler=LowConfidenceScheduler(steps_per_block=per_block), cache=DualCache(),
        gen_length=gen_length, block_length=block_length, stop_at_eos=False))
    return torch.cat([prompt, result.tokens.to(prompt.device)], dim=1), steps
'''
V1_CONFIG = '''
class LLaDAConfig:
    def __init__(self, **fields):
        self.fields = fields
'''
V1_MODEL = '''
from dllm_decode.models.llada import LLaDAConfig as Ours, LLaDAModelLM as Base
from .configuration_llada import LLaDAConfig    # the real file imports its config relatively


class LLaDAModelLM(Base):
    def __init__(self, config: LLaDAConfig):
        super().__init__(Ours.from_dict(config.fields))
'''
V2_FUNCTIONS = '''
import torch


class Fast_dLLM_QwenForCausalLM:
    @torch.no_grad()
    def batch_sample(self, input_ids, tokenizer, block_size, max_new_tokens, small_block_size, min_len,
                     seq_len, mask_id=151665, threshold=0.95, stop_token=151645, use_block_cache=False,
                     top_p=0.95, temperature=0.0):
        from dllm_decode import DecodeConfig, generate
        from dllm_decode.caches import BlockCache
        from dllm_decode.schedulers import LowConfidenceScheduler

        assert threshold == 1.0 and small_block_size == block_size and tokenizer.pad_token_id is not None
        result = generate(self, input_ids.tolist(), DecodeConfig(
            scheduler=LowConfidenceScheduler(steps_per_block=block_size), cache=BlockCache(),
            gen_length=max_new_tokens, block_length=block_size, stop_at_eos=False))
        return {i: torch.cat([input_ids[i], result.tokens[i].to(input_ids.device)]) for i in range(len(input_ids))}
'''
V2_CONFIG = '''
class Fast_dLLM_QwenConfig:
    def __init__(self, **fields):
        self.fields = fields
'''
V2_MODEL = '''
from dllm_decode.models.fast_dllm import FastDLLMConfig, FastDLLMModel


class Fast_dLLM_QwenForCausalLM(FastDLLMModel):
    def __init__(self, config):
        super().__init__(FastDLLMConfig.from_dict(config.fields))
'''


def write_checkout(root: Path, files: dict[str, str], git: bool = True) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    if git:
        for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"]):
            subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    return root


V1 = {"llada/generate.py": V1_GENERATE, "llada/model/__init__.py": "", "llada/model/configuration_llada.py": V1_CONFIG,
      "llada/model/modeling_llada.py": V1_MODEL}
V2 = {"v2/generation_functions.py": V2_FUNCTIONS, "v2/configuration.py": V2_CONFIG, "v2/modeling.py": V2_MODEL}


def quick(**changes) -> ShapedOptions:
    return ShapedOptions(**{**dict(shape="embedded", layers=1, dtype="float32", batch_sizes=(1,), gen_length=32,
                                   block_length=16, repeats=1, prompt_length=8, prompts=2), **changes})


def peer_rows(report: dict) -> list[dict]:
    return [r for r in report["rows"] if r["runtime"].startswith("peer:")]


def test_fast_dllm_v1_runs_unmodified_at_the_same_policy(tmp_path, one_thread):
    root = write_checkout(tmp_path / "fast-dllm", V1)
    report = run_shaped(quick(caches=("dual",), batch_sizes=(1, 2), peers=(("fast-dllm", str(root)),)))
    calls = json.loads((root / "llada" / "calls.json").read_text())
    assert calls == dict(steps=4, gen_length=32, block_length=16, temperature=0.0, remasking="low_confidence",
                         mask_id=3, threshold=None, prompt=[1, 8])
    one, two = peer_rows(report)
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert one["available"] and one["commit"] == commit and one["runtime"] == f"peer:fast-dllm-v1@{commit[:12]}"
    assert one["identical_tokens"] is True and one["same_tokens_as"] == "reference eager"
    assert one["nfe"] == 4.0 and one["forwards"] == 8 and one["ours_speedup"] > 0
    assert one["overhead"] is None                        # not our loop: its forwards are not timed
    assert not two["available"] and "at most 1 prompt" in two["note"]


def test_different_tokens_are_reported_not_hidden(tmp_path, one_thread):
    files = dict(V1, **{"llada/generate.py": V1_GENERATE.replace(
        "return torch.cat([prompt, result.tokens.to(prompt.device)], dim=1), steps",
        "return torch.cat([prompt, (result.tokens + 1).to(prompt.device) % 129], dim=1), steps")})
    root = write_checkout(tmp_path / "fast-dllm", files, git=False)
    row, = peer_rows(run_shaped(quick(caches=("dual",), peers=(("fast-dllm", str(root)),))))
    assert row["available"] and row["identical_tokens"] is False
    assert row["commit"] == "unknown (not a git checkout)" == checkout_commit(root)
    (root / ".git-commit").write_text("24cc59e1\n")            # an exported copy names its commit
    assert checkout_commit(root) == "24cc59e1 (from .git-commit)"
    inner = write_checkout(tmp_path / "outer", {"x": ""}) / "peer"    # inside another repository:
    inner.mkdir()                                                    # not the outer one's commit
    assert checkout_commit(inner) == "unknown (not a git checkout)"


def test_fast_dllm_v2_batch_sample_on_the_block_model(tmp_path, one_thread):
    root = write_checkout(tmp_path / "fast-dllm", V2)
    assert loops_in("fast-dllm", str(root)) == ["fast-dllm-v2"]
    report = run_shaped(quick(caches=("block",), steps_per_block=16, batch_sizes=(1, 2),
                              peers=(("fast-dllm", str(root)),)))
    rows = peer_rows(report)
    assert [r["batch"] for r in rows] == [1, 2] and all(r["available"] for r in rows)
    assert all(r["identical_tokens"] is True and r["model"] == "block" for r in rows)
    ours = next(r for r in report["rows"] if r["runtime"] == "reference" and r["batch"] == 1)
    assert rows[0]["nfe"] == ours["nfe"]                    # its forwards, counted, equal ours
    # at 2 steps per block batch_sample's threshold policy is not the benchmark's: said, not run
    report = run_shaped(quick(caches=("block",), peers=(("fast-dllm", str(root)),)))
    row, = peer_rows(report)
    assert not row["available"] and "--steps-per-block 16" in row["note"]


def test_a_peer_that_cannot_run_is_a_row_that_says_why(tmp_path, one_thread):
    broken = dict(V1, **{"llada/generate.py": "def generate_with_dual_cache(model, prompt):\n    pass\n"})
    root = write_checkout(tmp_path / "broken", broken, git=False)
    row, = peer_rows(run_shaped(quick(caches=("dual",), peers=(("fast-dllm", str(root)),))))
    assert not row["available"] and "TypeError" in row["note"] and "steps" in row["note"]
    root = write_checkout(tmp_path / "v1", V1, git=False)
    row, = peer_rows(run_shaped(quick(caches=("none",), peers=(("fast-dllm", str(root)),))))
    assert not row["available"] and "--cache dual" in row["note"]
    empty = tmp_path / "empty"
    empty.mkdir()
    row, = peer_rows(run_shaped(quick(caches=("none",), peers=(("fast-dllm", str(empty)),))))
    assert not row["available"] and "holds none" in row["note"]


@pytest.mark.parametrize("text, fragment", [("fast-dllm", "NAME=PATH"), ("sglang=/tmp", "unknown peer"),
                                            ("fast-dllm=/no/such/dir", "not a directory")])
def test_bad_peer_flags(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_peer(text)


def test_bad_peer_flag_is_one_line_on_the_command_line():
    from click.testing import CliRunner

    from dllm_decode.cli import main

    result = CliRunner().invoke(main, ["bench", "shaped", "--quick", "--peer", "fast-dllm=/no/such/dir"])
    assert result.exit_code == 2 and "--peer" in result.output and "Traceback" not in result.output


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("DLLM_DECODE_PEER_FAST_DLLM"),
                    reason="set DLLM_DECODE_PEER_FAST_DLLM to a checkout of NVlabs/Fast-dLLM")
def test_real_fast_dllm_v1_checkout(one_thread):
    """The real `generate_with_dual_cache` and its own LLaDA class on this project's weights
    (float32, greedy): same NFE and the same tokens as this project's dual cache."""
    path = os.environ["DLLM_DECODE_PEER_FAST_DLLM"]
    row = next(r for r in peer_rows(run_shaped(quick(caches=("dual",), peers=(("fast-dllm", path),))))
               if r["runtime"].startswith("peer:fast-dllm-v1"))
    assert row["available"], row.get("note")
    assert row["identical_tokens"] is True and row["nfe"] == 4.0 and row["commit"] == checkout_commit(path)
