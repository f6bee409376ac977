"""`dllm-decode verify --model DIR`: this package's port of a checkpoint against the reference
implementation the checkpoint names (`dllm_decode.verify`). Exit 0 when every check passes, 1
when one fails, 2 for a checkpoint it cannot verify (no reference, no opt-in)."""

from __future__ import annotations

import json

import click

from dllm_decode.cli.options import trust_option


@click.command("verify")
@click.option("--model", "model_name", required=True,
              help="A checkpoint directory or a Hub id in the local cache.")
@click.option("--device", default=None, help="torch device (default: cpu).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the prompts and the decodes.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for CI).")
@trust_option
def verify_command(model_name: str, device: str | None, seed: int, as_json: bool,
                   trust_remote_code: bool) -> None:
    """Check the port against the checkpoint's reference: largest logit difference against the
    tolerance, and seeded decode agreement where the reference has a generate."""
    from dllm_decode.cli.options import device_option
    from dllm_decode.models.checkpoint import ModelLoadError
    from dllm_decode.verify import VerifyError, verify

    where = device_option(device)
    try:
        report = verify(model_name, trust_remote_code=trust_remote_code,
                        device=None if where is None else str(where), seed=seed)
    except (VerifyError, ModelLoadError) as err:
        raise click.UsageError(str(err)) from None
    if as_json:
        click.echo(json.dumps(report.to_dict()))
    else:
        click.echo(f"{report.model} ({report.family}) vs {report.reference}")
        for check in report.checks:
            mark = "PASS" if check.ok else "FAIL"
            bound = f" (tolerance {check.tolerance:.3g})" if check.name == "logits" else ""
            click.echo(f"  {mark} {check.name}: {check.value:.3g}{bound}; {check.detail}")
    if not report.ok:
        raise SystemExit(1)
