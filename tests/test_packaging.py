"""Packaging: one import namespace that survives hostile surroundings, a complete package list,
and a wheel that carries the package data and none of the training recipes (`recipes/`).

The hostile directory holds what research repositories often hold: its own `eval.py`,
`schedulers/` and `filters/` packages, plus a foreign top-level `filters` distribution on the
path. The CLI and the README's Python snippet must run from there unaffected.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import zipfile

import pytest

tomllib = pytest.importorskip("tomllib")      # Python >= 3.11

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOREIGN = "raise ImportError('the foreign package was imported instead of dllm_decode')\n"


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed():
    setup = pyproject()["tool"]["setuptools"]
    mapping = {"dllm_decode": "dllm_decode", **setup["package-dir"]}
    found = set()
    for name, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            relative = init.parent.relative_to(base).parts
            dotted = ".".join([name, *relative])
            # a folder mapped elsewhere (dllm_decode/... never holds the plugins) is its own entry
            found.add(dotted)
    assert found == set(setup["packages"])


def test_every_shipped_model_is_package_data():
    """Each `--model` shipped name resolves to a folder the wheel's package-data glob carries,
    holding what the loader reads (config, weights, tokenizer)."""
    from fnmatch import fnmatch

    from dllm_decode.models.checkpoint import EMBEDDED_DIR, EMBEDDED_NAMES

    globs = pyproject()["tool"]["setuptools"]["package-data"]["dllm_decode"]
    for name, folder in EMBEDDED_NAMES.items():
        for file in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
            path = EMBEDDED_DIR / folder / file
            assert path.is_file(), f"{name}: {path} is missing"
            relative = path.relative_to(ROOT / "dllm_decode").as_posix()
            assert any(fnmatch(relative, g) for g in globs), f"{name}: {relative} is not package data"


def hostile_directory(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict[str, str]]:
    """A working directory and an environment full of things named like our folders."""
    work = tmp_path / "research"
    (work / "schedulers").mkdir(parents=True)
    (work / "filters").mkdir()
    (work / "eval.py").write_text(FOREIGN)
    (work / "schedulers" / "__init__.py").write_text(FOREIGN)
    (work / "filters" / "__init__.py").write_text(FOREIGN)
    foreign = tmp_path / "site"
    for name in ("filters", "caches"):
        (foreign / name).mkdir(parents=True)
        (foreign / name / "__init__.py").write_text(FOREIGN)
    env = {**os.environ, "PYTHONPATH": str(foreign)}
    return work, env


README_SNIPPET = textwrap.dedent("""
    import torch
    from dllm_decode import DecodeConfig, generate, load_model
    from dllm_decode.schedulers import ThresholdScheduler

    model = load_model("embedded")
    config = DecodeConfig(scheduler=ThresholdScheduler(threshold=0.9), gen_length=32, block_length=32)
    result = generate(model, ["sort : mia ella hank"], config, generator=torch.Generator().manual_seed(0))
    import dllm_decode.filters, dllm_decode.caches, dllm_decode.eval.tasks
    assert "research" not in dllm_decode.filters.__file__ and "site" not in dllm_decode.caches.__file__
    print(result.text[0])
""")


def test_cli_and_api_run_from_a_hostile_directory(tmp_path):
    work, env = hostile_directory(tmp_path)
    api = subprocess.run([sys.executable, "-c", README_SNIPPET], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    assert api.returncode == 0, api.stderr
    assert api.stdout.strip() == "ella hank mia"
    cli = subprocess.run([sys.executable, "-m", "dllm_decode", "--model", "tiny", "--gen-length", "8",
                          "--block-length", "8", "--prompt", "w1 w2", "--scheduler", "low_confidence"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr


def test_bare_names_are_refused_even_from_the_repository_root():
    for name in ("schedulers", "caches", "filters", "eval"):
        probe = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
        assert probe.returncode != 0 and f"'dllm_decode.{name}'" in probe.stderr


@pytest.mark.slow
def test_wheel_installs_the_namespace_and_the_package_data(tmp_path):
    # built without isolation (no download): the environment's setuptools must be the one
    # pyproject.toml's [build-system] asks for (SPDX `license` strings need 77+)
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} here; the build needs >= 77 "
                    f"(pip install 'setuptools>=77')")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(tmp_path / "dist"), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("dllm_decode-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    recipes = {p.stem for p in (ROOT / "recipes").glob("*.py")} - {"__init__"}
    assert recipes and not [n for n in names if n.startswith("recipes/")
                            or pathlib.PurePosixPath(n).stem in recipes and "/training/" in n]
    assert "dllm_decode/eval/training/filter.py" in names          # what train-filter runs stays
    assert "dllm_decode/embedded/noise/model.safetensors" in names   # the shipped noise model
    site = tmp_path / "installed"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                                str(site), str(wheel)], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr
    work, env = hostile_directory(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    probe = subprocess.run([sys.executable, "-c", README_SNIPPET + textwrap.dedent(f"""
        import dllm_decode.eval.harness.lm_eval_adapter as adapter
        assert str(dllm_decode.filters.__file__).startswith({str(site)!r}), dllm_decode.filters.__file__
        assert (adapter.TASKS_DIR / "dllm_copy.yaml").is_file()
        """)], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr
