"""`dllm-decode freq-table`: PC-Sampler's background frequency table for a model's tokenizer, built
offline from local text."""

from __future__ import annotations

import click


@click.command("freq-table")
@click.option("--model", "model_name", required=True,
              help="Whose tokenizer counts: a checkpoint directory or shipped name (`embedded`).")
@click.option("--text", "texts", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="Local text: a plain-text file (one text per line) or, with --field, JSONL. Repeatable.")
@click.option("--field", default=None, help="The JSONL field holding the text.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="The table to write (.safetensors); give it to `-o table=PATH` of pc_sampler.")
def freq_table_command(model_name: str, texts: tuple[str, ...], field: str | None, out_path: str) -> None:
    """Count the tokenizer's ids over local text (nothing is downloaded) into a frequency table."""
    import json
    from pathlib import Path

    from dllm_decode.cli.options import usage_errors
    from dllm_decode.models.checkpoint import load_tokenizer, resolve_model_dir
    from dllm_decode.schedulers.frequency import build_frequency_table

    with usage_errors("--model"):
        tokenizer = load_tokenizer(resolve_model_dir(model_name))
    if tokenizer is None:
        raise click.BadParameter(f"{model_name!r} has no tokenizer to count with", param_hint="--model")

    def lines():
        for name in texts:
            for number, line in enumerate(Path(name).read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                if field is None:
                    yield line
                    continue
                try:
                    value = json.loads(line)[field]
                except (ValueError, KeyError, TypeError):
                    raise click.BadParameter(f"{name}:{number} is not a JSON object with a {field!r} field",
                                             param_hint="--text") from None
                yield str(value)

    with usage_errors("--text"):
        table = build_frequency_table(tokenizer, lines(), source=", ".join(texts))
    path = table.save(out_path)
    click.echo(f"wrote {path}: {table.total} tokens, {len(table.ids)} distinct ids")
