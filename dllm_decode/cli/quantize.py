"""`dllm-decode quantize`: write a quantized safetensors checkpoint that `load_model` reads back."""

from __future__ import annotations

import click

from dllm_decode.cli.options import RegistryHelp, registry_names


@click.command("quantize")
@click.option("--model", "model_name", required=True,
              help="A diffusion LM checkpoint directory or shipped name (`embedded`, `embedded-bd`).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the quantized checkpoint (config.json, model.safetensors, tokenizer).")
@click.option("--format", "fmt", required=True, metavar="int8|fp8|int4[:GROUP]",
              help="int8 / fp8: per output channel; int4: group-wise (int4:64; int4 alone: 128).")
@click.option("--calibration", type=click.IntRange(0, 512), default=0, show_default=True,
              help="int4 only: calibrate GPTQ on this many train-split task prompts (at most 512); "
                   "0: round to nearest.")
@click.option("--calibration-source", type=click.Choice(["decode", "clean"]), default="decode",
              show_default=True,
              help="decode: every forward of real decodes (canvases at the mask ratios and steps "
                   "the decoder visits); clean: prompt + reference answer, nothing masked.")
@click.option("--calibration-tasks", default="all", show_default=True,
              help="Task names or groups (comma-separated) the calibration prompts come from.")
@click.option("--scheduler", default="threshold", show_default=True, cls=RegistryHelp,
              help=lambda: f"The scheduler of the calibration decodes, one of "
                           f"{registry_names('scheduler')}.")
@click.option("--device", default=None, help="torch device of the calibration (default: cpu).")
def quantize_command(model_name: str, out_dir: str, fmt: str, calibration: int,
                     calibration_source: str, calibration_tasks: str, scheduler: str,
                     device: str | None) -> None:
    """Quantize a checkpoint's linear layers (weight-only) and save it; `--model DIR2` loads it."""
    from pathlib import Path

    from dllm_decode.cli.options import device_option, usage_errors, writable_dir
    from dllm_decode.quant.spec import QuantError, QuantSpec

    try:
        spec = QuantSpec.parse(fmt)
    except QuantError as err:
        raise click.BadParameter(str(err), param_hint="--format") from None
    if calibration and spec.format != "int4":
        raise click.BadParameter(f"calibration (GPTQ) applies to int4; {spec.format} rounds to "
                                 f"nearest", param_hint="--calibration")
    where = device_option(device)
    from dllm_decode.models.checkpoint import read_config, resolve_model_dir
    from dllm_decode.models.loading import load_model

    with usage_errors("--model"):
        source = resolve_model_dir(model_name)
        config = read_config(source)
        if "quantization_config" in config:
            raise click.BadParameter(f"{source} is already quantized", param_hint="--model")
        model = load_model(source, device=where)
    if Path(out_dir).expanduser().resolve() == source.resolve():
        raise click.BadParameter("--out must differ from the model's folder", param_hint="--out")
    writable_dir(out_dir, "--out")
    codes, record = None, {"method": "round-to-nearest"}
    if calibration:
        with usage_errors("--calibration"):
            codes, record = _gptq(model, spec, calibration, calibration_source, calibration_tasks,
                                  scheduler)
    from dllm_decode.quant import quantize_model
    from dllm_decode.quant.checkpoint import save_quantized

    with usage_errors("--format"):
        quantize_model(model, spec, codes=codes)
    save_quantized(model.to("cpu"), out_dir, config, source, record)
    click.echo(out_dir)


def _gptq(model, spec, count, source, tasks, scheduler):
    """GPTQ codes per layer from the chosen calibration, and its record for config.json."""
    from dllm_decode.eval.harness.calibration import calibration_examples, record_hessians
    from dllm_decode.quant.apply import check_group_size
    from dllm_decode.quant.gptq import gptq_int4

    check_group_size(model, spec)
    examples = calibration_examples(count, seed=1, selection=tasks)
    recorder = record_hessians(model, source, examples, scheduler=scheduler)

    def codes(path, layer):
        hessian = recorder.hessians.get(path)
        return None if hessian is None else gptq_int4(layer.weight, hessian, spec.group_size)

    record = {"method": "gptq", "source": source, "prompts": len(examples), "tasks": tasks,
              "scheduler": scheduler if source == "decode" else None, "split": "train",
              "rows": sum(recorder.rows.values()) // max(len(recorder.rows), 1)}
    return codes, record
