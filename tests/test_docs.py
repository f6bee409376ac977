"""Every example in the documentation keeps working, and the generated pages stay honest.

* Every `dllm-decode ...` line of every page parses (fast; catches renamed options).
* The python blocks that need no server run, page by page (fast).
* Every page's blocks run for real, servers included (slow): see `tests/doc_examples.py` for
  the markers (`gpu`, `skip`, `serve`, `with-server`, `needs lm_eval`).
* The compatibility matrix's cells are real decodes; the results page reads every measurement
  file with its fields.
"""

from __future__ import annotations

import importlib.util
import json
import re

import click
import pytest

from tests.doc_examples import ROOT, blocks, cli_lines, parse, run_page

DOCS = ROOT / "docs"
NAV_LATER = {"serving-limits.md"}
"""Pages written on other branches that the nav gains when they are merged."""
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))


def _text(page: str) -> str:
    return (DOCS / page).read_text()


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_page_is_in_the_nav():
    config = (ROOT / "mkdocs.yml").read_text()
    nav = config[config.index("\nnav:"):]
    listed = set(re.findall(r":\s*(\S+\.md)\s*$", nav, flags=re.M))
    assert listed <= set(PAGES), listed - set(PAGES)
    assert set(PAGES) - listed <= NAV_LATER, set(PAGES) - listed - NAV_LATER


def _all_cli_lines() -> list[tuple[str, str]]:
    return [(page, line) for page in PAGES for line in cli_lines(_text(page))]


def test_the_docs_have_examples():
    assert len(_all_cli_lines()) >= 30
    assert sum(b.language == "python" for p in PAGES for b in blocks(_text(p))) >= 6


@pytest.mark.parametrize("page, line", _all_cli_lines())
def test_every_cli_example_parses(page, line):
    try:
        parse(line)
    except click.exceptions.Exit as done:          # --version / --help answer and exit
        assert done.exit_code == 0, line
    except click.ClickException as err:
        pytest.fail(f"{page}: {line!r}: {err.format_message()}")


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.language == "python" for b in blocks(_text(p)))])
def test_python_blocks_run(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_page(_text(page), page, tmp_path, fast_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_every_block_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    skipped = run_page(_text(page), page, tmp_path)
    for reason in skipped:
        print("skipped:", reason)


def test_markers_are_known():
    known = {"gpu", "skip", "serve", "with-server", "needs", "lm_eval", "installs", "packages",
             "first-hour"}
    for page in PAGES:
        for block in blocks(_text(page)):
            assert block.marks <= known, (page, block.marks - known)
            if "serve" in block.marks:
                assert block.code.strip().startswith("dllm-decode serve"), page


def test_results_rows_carry_every_field():
    rows = _hooks().measurement_rows()
    assert rows, "no measurement files found"
    for row in rows:
        for key in ("machine", "date", "commit", "samples", "command"):
            assert row[key], (row["file"], key)


def test_results_rows_read_a_files_own_keys(tmp_path):
    folder = tmp_path / "cpu_2026-01-02"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"device": "a CPU", "repeats": 3, "command": "dllm-decode bench loop"}))
    (folder / "run.txt").write_text("the table\n")
    (folder / "notes.txt").write_text("a log\n")
    rows = {r["file"]: r for r in _hooks().measurement_rows(tmp_path)}
    assert set(rows) == {"run.json", "notes.txt"}            # a .txt twin is shown with its JSON
    run = rows["run.json"]
    assert (run["machine"], run["date"], run["samples"], run["command"]) == ("a CPU", "2026-01-02", 3, "dllm-decode bench loop")
    assert run["commit"] is None and run["text"] == "the table\n"


def test_compatibility_cells_are_real_decodes():
    from dllm_decode.caches import BlockCache, DualCache
    from dllm_decode.compat import accepted_caches, markdown, try_decode
    from dllm_decode.schedulers import SaberScheduler, ThresholdScheduler
    from dllm_decode.testing import tiny_block_diffusion, tiny_llada

    llada, sdar = tiny_llada(), tiny_block_diffusion("sdar")
    assert try_decode(sdar, ThresholdScheduler(), BlockCache()).ok
    refused = try_decode(llada, ThresholdScheduler(), BlockCache())
    assert not refused.ok and "accepted caches for this model: none, prefix, dual, d2, elastic, suffix, dllm_cache, dkv" in refused.reason
    assert not try_decode(llada, SaberScheduler(), DualCache()).ok
    assert accepted_caches(llada) == ["none", "prefix", "dual", "d2", "elastic", "suffix", "dllm_cache", "dkv", "es"]
    assert accepted_caches(sdar) == ["none", "prefix", "dual", "block", "suffix"]
    table = markdown({("threshold", "block"): refused, ("threshold", "none"): try_decode(llada, ThresholdScheduler(), DualCache())})
    assert "| `threshold` | no (1) | yes |" in table and "\n1. cache BlockCache" in table


# --- no documented example prints a wrong answer ---------------------------------------------

EXPECTED = {"copy": lambda names: names, "sort": sorted, "reverse": lambda names: names[::-1]}


def _answer_examples() -> list[tuple[str, str]]:
    """(page, line) for every documented decode (`dllm-decode ...` or `dllm-decode spec ...`)
    of a copy/sort/reverse prompt on a shipped model: its answer is known."""
    import shlex

    out = []
    for page, text in [("README.md", (ROOT / "README.md").read_text())] + [(p, _text(p)) for p in PAGES]:
        for line in cli_lines(text):
            args = shlex.split(line)[1:]
            if args and not args[0].startswith("-") and args[0] != "spec":
                continue                                   # another subcommand
            if "--prompt" not in args or any(a in args for a in ("--device", "--input")):
                continue
            prompt = args[args.index("--prompt") + 1]
            model = args[args.index("--model") + 1] if "--model" in args else "embedded"
            if prompt.split(" : ")[0] in EXPECTED and model.startswith("embedded"):
                out.append((page, line))
    return sorted(set(out))


def test_answer_examples_are_found():
    assert len(_answer_examples()) >= 8


@pytest.mark.parametrize("page, line", _answer_examples())
def test_no_documented_example_prints_a_wrong_answer(page, line):
    import shlex

    from click.testing import CliRunner

    from dllm_decode.cli import main

    args = shlex.split(line)[1:]
    task, names = args[args.index("--prompt") + 1].split(" : ")
    expected = " ".join(EXPECTED[task](names.split()))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, f"{page}: {line}\n{result.output}"
    printed = result.output.strip().splitlines()[-1]
    text = json.loads(printed)["text"] if "--json" in args else printed
    assert text.strip() == expected, f"{page}: {line!r} prints {text!r}, not {expected!r}"


def test_results_name_nested_folders_with_their_own_readme(tmp_path):
    (tmp_path / "cpu_2026-01-02" / "rules").mkdir(parents=True)
    (tmp_path / "cpu_2026-01-02" / "rules" / "README.md").write_text("\n# New rules side by side\n\nmore\n")
    (tmp_path / "cpu_2026-01-02" / "README.md").write_text("# top\n")
    assert _hooks().nested_folders(tmp_path) == [(f"{tmp_path.name}/cpu_2026-01-02/rules", "New rules side by side")]
