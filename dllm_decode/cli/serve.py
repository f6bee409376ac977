"""`dllm-decode serve`: the OpenAI-compatible HTTP server (`dllm_decode.serve`; needs the
`[serve]` extra: FastAPI and uvicorn)."""

from __future__ import annotations

import os
from typing import Any

import click

from dllm_decode.cli.decode import MODEL_HELP, record_options
from dllm_decode.cli.launch import tensor_parallel_option
from dllm_decode.cost import DEFAULT_REQUEST_BYTES, MAX_CANVAS, MAX_ROWS
from dllm_decode.cli.options import CORES, FloatRange, capture_options
from dllm_decode.prefix_options import MAX_PREFIX_BYTES, PrefixOptions


class Seconds(FloatRange):
    """A finite number of seconds > 0 (`inf` and `nan` are refused: every timer needs an end)."""

    def __init__(self) -> None:
        super().__init__(0, min_open=True)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        out = super().convert(value, param, ctx)
        if out == float("inf"):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return out

SERVE_MODEL_HELP = MODEL_HELP.rstrip(".") + ", or `ar:TARGET[+DRAFT][@RUNTIME]` (a causal LM, plain " \
    "or speculative, one request at a time each)."


@click.command("serve")
@lambda command: record_options(command, SERVE_MODEL_HELP)
@capture_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--served-model-name", default=None, help="The model id clients send [--model].")
@click.option("--max-concurrent", type=click.IntRange(1, MAX_ROWS), default=8, show_default=True,
              help="Requests decoded at once (batch rows); more wait in the queue.")
@click.option("--max-queue", type=click.IntRange(0, 16 * MAX_ROWS), default=64, show_default=True,
              help="Requests that may wait for a row; beyond that a request gets 429.")
@click.option("--max-tokens", type=click.IntRange(1, MAX_CANVAS), default=1024, show_default=True,
              help="The largest canvas (gen_length) a request may ask for.")
@click.option("--request-timeout", type=Seconds(), default=600.0,
              show_default=True, help="Seconds per request, queueing included (then 504).")
@click.option("--shutdown-timeout", type=Seconds(), default=30.0,
              show_default=True, help="On SIGINT/SIGTERM, seconds in-flight requests get to finish "
              "before they are cancelled.")
@click.option("--max-body-bytes", type=click.IntRange(1, 1 << 30), default=1 << 20, show_default=True,
              help="The largest request body (then 413).")
@click.option("--body-timeout", type=Seconds(), default=30.0, show_default=True,
              help="Seconds a request body may take to arrive in full (then 408).")
@click.option("--max-draft", type=click.IntRange(1, 256), default=8, show_default=True,
              help="ar: models: most tokens drafted per round.")
@click.option("--threads", type=click.IntRange(1, CORES), default=None,
              help=f"torch threads of the engine, at most the {CORES} core(s) this process may use "
                   f"(default: torch's).")
@click.option("--max-request-bytes", type=click.IntRange(1), default=DEFAULT_REQUEST_BYTES, show_default=True,
              help="The estimated memory one request's decoding step may take (its canvas rows x "
                   "tokens x vocabulary, look-ahead candidates included); a request over it gets a 400 "
                   "naming the option to lower.")
@click.option("--prefix-cache-bytes", type=click.IntRange(0, MAX_PREFIX_BYTES), default=0, show_default=True,
              help="Byte budget of the cross-request prefix cache (per rank): requests under the `block` "
                   "cache of a block-diffusion model reuse the K/V of earlier requests' whole prompt "
                   "blocks, exactly, as DiffusionGemma's causal encoder reuses a prompt's K/V; least "
                   "recently used blocks are evicted. 0: off.")
@click.option("--prefix-cache-approximate", type=click.IntRange(0, MAX_CANVAS), default=0, show_default=True,
              help="Opt in to APPROXIMATE reuse of stored prompt K/V, in chunks of this many tokens, under the "
                   "`prefix` cache (LLaDA/Dream: tokens may change). Needs --prefix-cache-bytes. 0: off.")
@click.option("--presets", "presets_path", type=click.Path(dir_okay=False), default=None,
              help="A `dllm-decode tune` presets.json: a request starts from one of its presets by name "
                   "(`dllm.preset`, or the model name MODEL:NAME, e.g. a task tag); checked against the model "
                   "here, at start-up.")
@click.option("--playground/--no-playground", default=None,
              help="Serve a browser playground at / (the canvas animating live) [on for a loopback --host].")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="info", show_default=True)
@tensor_parallel_option
def serve_command(model_name: str, chat_template: bool, device: str | None, dtype: str | None,
                  host: str, port: int, served_model_name: str | None, max_concurrent: int,
                  max_queue: int, max_tokens: int, request_timeout: float, shutdown_timeout: float,
                  max_body_bytes: int, body_timeout: float, max_draft: int, threads: int | None,
                  max_request_bytes: int, presets_path: str | None, log_level: str,
                  playground: bool | None = None, trust_remote_code: bool = False,
                  runtime: str | None = None, tensor_parallel: int = 1, cuda_graphs: bool = False,
                  compile_step: bool = False, adapter: tuple[str, ...] = (), quantize: str | None = None,
                  prefix_cache_bytes: int = 0, prefix_cache_approximate: int = 0,
                  attention: str | None = None, kv_cache_dtype: str = "auto", **record: Any) -> None:
    """Serve a model over HTTP: /v1/completions, /v1/chat/completions (streamed with
    "stream": true), /v1/models, /health, /metrics, /openapi.json. The decoding options are the
    server's defaults; a request changes them in its `dllm` object, choosing among registered
    components and values (anything that loads a file is set here, at start-up).

    Tensor parallel: `torchrun --nproc_per_node N -m dllm_decode serve --tensor-parallel N ...`;
    rank 0 owns HTTP, the other ranks follow its engine (`dllm_decode.serve.worker.follow`)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise click.ClickException("serving needs FastAPI and uvicorn: pip install 'dllm-decode[serve]'") \
            from None
    from dllm_decode.cli.decode import decode_record, record_preset
    from dllm_decode.cli.options import capture_mode, device_option, model_spec, usage_errors
    from dllm_decode.serve.app import Limits

    if served_model_name is not None and not served_model_name.strip():
        raise click.BadParameter("the served model name is empty", param_hint="--served-model-name")
    from dllm_decode.cli import launch
    from dllm_decode.cli.adapters import split_adapters
    from dllm_decode.cli.self_decoding import build_self_decoder, preset_self_decoder, refuse_serving

    refuse_serving(build_self_decoder(record.pop("self_decoder"), record.pop("self_decoder_opts")))
    adapters = split_adapters(adapter, named_ok=True)
    spec = model_spec(model_name)
    where = device_option(device)
    capture = capture_mode(cuda_graphs, compile_step, where, spec)
    with usage_errors("--prefix-cache-bytes"):            # before the model loads
        PrefixOptions(prefix_cache_bytes, capture, spec.kind == "ar", prefix_cache_approximate)
    world = launch.check_world(tensor_parallel, "serve")
    if spec.kind == "ar" and tensor_parallel > 1:
        raise click.BadParameter("--tensor-parallel shards a diffusion LM; `ar:` models run in "
                                 "one process", param_hint="--tensor-parallel")
    if spec.kind == "ar" and quantize is not None:
        raise click.BadParameter(f"--quantize applies to a diffusion LM checkpoint, not "
                                 f"{str(spec)!r}", param_hint="--quantize")
    if spec.kind == "ar" and attention is not None:
        raise click.BadParameter(f"--attention applies to a diffusion LM checkpoint, not "
                                 f"{str(spec)!r}", param_hint="--attention")
    if spec.kind == "ar" and kv_cache_dtype != "auto":
        raise click.BadParameter(f"--kv-cache-dtype applies to a diffusion LM checkpoint, not "
                                 f"{str(spec)!r}", param_hint="--kv-cache-dtype")
    if spec.kind == "ar" and adapters and (adapters.merged or adapters.named):
        raise click.BadParameter("LoRA adapters apply to diffusion models", param_hint="--adapter")
    if adapters and adapters.named and capture != "off":
        raise click.BadParameter("unmerged adapters (NAME=DIR) run the eager step; drop --cuda-graphs/"
                                 "--compile-step or merge the adapter (DIR alone)", param_hint="--adapter")
    if spec.kind == "ar":
        if record.get("cache_name") not in (None, "none") or record.get("cache_opts"):
            raise click.BadParameter(f"--cache {record.get('cache_name')} does not apply to `ar:` models: a "
                                     f"causal LM always decodes with its own KV cache (leave --cache out)",
                                     param_hint="--cache / -c")
        record = {**record, "scheduler": _rule(record)}
    preset = record_preset(record.pop("preset", None), spec)
    refuse_serving(preset_self_decoder(preset, None))
    config = decode_record(**record, preset=preset)
    if config.gen_length > max_tokens:
        raise click.BadParameter(f"--gen-length {config.gen_length} exceeds --max-tokens {max_tokens}",
                                 param_hint="--gen-length")
    with usage_errors():
        limits = Limits(max_queue=max_queue, request_timeout=request_timeout,
                        shutdown_timeout=shutdown_timeout, max_body_bytes=max_body_bytes,
                        body_timeout=body_timeout)
    if world == 1 or os.environ.get("RANK", "0") == "0":     # the options first: a taken port
        _check_address(host, port)                           # never hides a bad option
    groups = launch.start(tensor_parallel, where, "serve", spec=spec)
    try:
        launch.agree(groups, model=str(spec), config=config.to_dict(), max_tokens=max_tokens)
        block_given = record["block_length"] is not None or (
            preset is not None and "block_length" in preset.parts)
        _serve(spec, where, dtype, config, block_given, presets_path, limits, max_draft,
               trust_remote_code, runtime,
               tensor_parallel, served_model_name, max_tokens, chat_template, max_concurrent,
               threads, host, port, log_level, groups, capture, playground, adapters, quantize,
               max_request_bytes, (prefix_cache_bytes, prefix_cache_approximate), attention, kv_cache_dtype)
    finally:
        launch.finish(groups)


def _vocab(model: Any) -> int | None:
    size = getattr(model, "vocab_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _serve(spec: Any, where: Any, dtype: str | None, config: Any, block_given: bool,
           presets_path: str | None, limits: Any, max_draft: int, trust_remote_code: bool,
           runtime: str | None,
           tensor_parallel: int, served_model_name: str | None, max_tokens: int,
           chat_template: bool, max_concurrent: int, threads: int | None, host: str, port: int,
           log_level: str, groups: Any, capture: str = "off", playground: bool | None = None,
           adapters: Any = None, quantize: str | None = None,
           max_request_bytes: int | None = None, prefix_cache: tuple[int, int] = (0, 0),
           attention: str | None = None, kv_cache_dtype: str = "auto") -> None:
    from dllm_decode.cli.decode import for_model, shipped_wanted
    from dllm_decode.cli.options import load_diffusion_model, usage_errors
    from dllm_decode.engine import Engine
    from dllm_decode.serve.app import ServerState, serve
    from dllm_decode.serve.protocol import Settings
    from dllm_decode.serve.worker import EngineWorker, follow, startup_check

    if spec.kind == "ar":
        model, kinds = _causal(spec, where, max_draft), ("scheduler", "draft_length")
    else:
        model = load_diffusion_model(spec, where, dtype, config.gen_length,
                                     trust_remote_code=trust_remote_code, runtime=runtime,
                                     tensor_parallel=tensor_parallel, quantize=quantize,
                                     adapter=adapters.merged if adapters else (), attention=attention,
                                     kv_cache_dtype=kv_cache_dtype)
        kinds = ("scheduler",)
    from dllm_decode.cli.adapters import attach_named

    adapter_names = attach_named(model, adapters.named) if adapters else ()
    if spec.kind != "ar":
        from dllm_decode.engine import check_cache

        with usage_errors():           # the cache, the attention or the scheduler: the message names it
            check_cache(model, config)
    tokenizer = getattr(model, "tokenizer", None)
    settings = Settings(model_id=served_model_name or str(spec),
                        config=for_model(config, model, block_given, shipped=shipped_wanted()),
                        max_tokens=max_tokens, chat_template=chat_template,
                        prepare=lambda c: for_model(c, model), scheduler_kinds=kinds,
                        presets=_request_presets(presets_path, spec, config, model),
                        adapters=adapter_names,
                        max_request_bytes=max_request_bytes, vocab_size=_vocab(model))
    with usage_errors("--model"):            # a uniform-noise model: no running batch yet
        engine = Engine(model, tokenizer, max_batch_size=max_concurrent, capture=capture,
                        prefix_cache_bytes=prefix_cache[0], prefix_cache_approximate=prefix_cache[1])
    problem = startup_check(engine, settings.config)        # every rank: the same steps
    if problem is not None:
        raise click.UsageError(f"this model cannot decode with these options: {problem}")
    control = None
    if groups.world > 1:
        from dllm_decode.parallel.control import ControlChannel

        control = ControlChannel(groups)
        if not control.leads:
            import signal

            # torchrun forwards SIGINT / SIGTERM to every rank; rank 0 drains its requests and
            # then publishes the stop, so a follower must keep stepping until it comes
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if threads is not None:
                import torch

                torch.set_num_threads(threads)
            follow(engine, control)                          # no sockets: rank 0 answers
            return
    state = ServerState(EngineWorker(engine, threads, control=control), settings, limits)
    from dllm_decode.viz.playground import is_local

    state.playground = is_local(host) if playground is None else playground
    if state.playground:
        click.echo(f"playground: http://{host}:{port}/ (--no-playground turns it off)", err=True)
    click.echo(f"serving {settings.model_id} on http://{host}:{port} (step: "
               f"{step_runtime(engine, settings.config)}; Ctrl-C to stop)", err=True)
    serve(state, host=host, port=port, log_level=log_level)


def step_runtime(engine: Any, config: Any) -> str:
    """How the engine runs a step of the server's default record: `eager`, the capture mode
    (`compile`, `cuda-graphs`), or `eager (REASON)` when that record cannot be captured."""
    if engine.capture == "off":
        return "eager"
    from dllm_decode.capture import capture_problem

    problem = capture_problem(config, engine.model)
    return engine.capture if problem is None else f"eager ({problem})"


def _request_presets(path: str | None, spec: Any, config: Any, model: Any) -> dict[str, Any]:
    """`--presets FILE`: each preset's record at the server's lengths, temperature and seed,
    checked against the model (a bad file or another model's presets: a usage error)."""
    if path is None:
        return {}
    from dllm_decode.cli.decode import for_model
    from dllm_decode.cli.options import usage_errors
    from dllm_decode.eval.harness.presets import identity_of, tuned_presets

    with usage_errors("--presets"):
        presets = tuned_presets(path, identity_of(spec))
        tuned = [name for name, preset in presets.items() if preset.build_self_decoder() is not None]
        if tuned:
            raise ValueError(f"preset {tuned[0]!r} decodes with a self-decoder, which the server's denoising "
                             f"loop cannot drive; serve a presets file without self-decoder presets")
        return {name: for_model(preset.config(gen_length=config.gen_length, block_length=preset.parts.get(
            "block_length", config.block_length), temperature=config.temperature, seed=config.seed), model)
            for name, preset in presets.items()}


def _check_address(host: str, port: int) -> None:
    """Bind the address once before the model loads, so a bad host or a port in use is a usage
    error at once rather than after minutes of loading."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET       # as uvicorn binds
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as err:
        raise click.BadParameter(f"cannot listen on {host}:{port}: {err.strerror or err}",
                                 param_hint="--host / --port") from None


def _causal(spec: Any, device: Any, max_draft: int) -> Any:
    """`ar:TARGET[+DRAFT][@RUNTIME]` -> a `SpeculativeModel` (load errors are usage errors)."""
    from dllm_decode.cli.options import usage_errors
    from dllm_decode.cli.spec import _quiet_transformers
    from dllm_decode.engine import SpeculativeModel
    from dllm_decode.speculative import DraftContext, make_drafter, with_runtime
    from dllm_decode.models.causal import load_causal_lm

    _quiet_transformers()
    with usage_errors("--model"):
        target = load_causal_lm(spec.name, device=device)
        drafter, _ = make_drafter(spec.draft or "none", DraftContext(target, device))
        return SpeculativeModel(with_runtime(target, spec.runtime), drafter, max_draft)


def _rule(record: dict[str, Any]) -> Any:
    """The scheduler of a causal LM: a diffusion scheduler or an AR draft-length rule (`heuristic`)."""
    from dllm_decode.cli.options import usage_errors
    from dllm_decode.speculative.schedule import draft_length_rule

    with usage_errors("--scheduler / -o"):
        return draft_length_rule({"name": record["scheduler"], **record["scheduler_opts"]})
