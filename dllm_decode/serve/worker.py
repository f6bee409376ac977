"""`EngineWorker`: the one thread that owns the `Engine` and does all torch work.

The web server's event loop never runs a model: it submits requests and cancellations through a
thread-safe inbox and receives each request's `Update`s through a callback (`sink`), which the
server turns into an `asyncio.Queue` put with `loop.call_soon_threadsafe`. The worker sleeps on
the inbox while the engine has no work and steps it otherwise.

Under tensor parallelism (`torchrun ... serve --tensor-parallel N`) the engine runs on every rank
of the TP group and the ranks must step it identically. Rank 0 owns HTTP and this worker; before
applying each batch of inbox commands (admitted requests, cancellations, stop) it publishes them
as JSON on the group's `ControlChannel` (`dllm_decode.parallel.control`), once per loop turn
(so also every half second while idle: a keepalive). The other ranks run `follow`: receive a
batch, apply it to their own engine in the same order, step when the engine has work, drop the
updates, and return on stop. Requests, seeds and logits being the same on every rank, every
engine takes the same decisions.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from dllm_decode.engine import Engine, Output, Request, Update

log = logging.getLogger(__name__)

Sink = Callable[[Update], None]


class EngineWorker:
    """Runs `engine.step()` in a background thread.

    Args:
        engine: the engine; only this worker's thread may touch it once `start()` ran.
        threads: torch intra-op threads of the worker (None: leave torch's setting).
        control: under tensor parallelism, the channel on which this (TP rank 0) worker publishes
            every command batch to the ranks running `follow`.
    """

    def __init__(self, engine: Engine, threads: int | None = None, control: Any = None):
        self.engine = engine
        self.threads = threads
        self.control = control             # a `ControlChannel` under tensor parallelism, else None
        self.inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.sinks: dict[str, Sink] = {}
        self.thread = threading.Thread(target=self._run, name="dllm-engine", daemon=True)
        self.stopping = threading.Event()
        self.failure: BaseException | None = None

    def start(self) -> None:
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and not self.stopping.is_set()

    def submit(self, request: Request, sink: Sink) -> None:
        """Queue a request; `sink` gets its updates on the worker thread (it must not block)."""
        self.inbox.put(("add", (request, sink)))

    def cancel(self, request_id: str) -> None:
        self.inbox.put(("cancel", request_id))

    def cancel_all(self) -> None:
        """Cancel every request in flight (each gets its `cancelled` update)."""
        self.inbox.put(("cancel_all", None))

    def stop(self, timeout: float | None = 10.0) -> None:
        """Cancel what is left, report it, and end the thread."""
        self.stopping.set()
        self.inbox.put(("stop", None))
        if self.thread.is_alive():
            self.thread.join(timeout)

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)
        try:
            while True:
                if not self._drain(block=not self.engine.has_work):
                    break
                if self.engine.has_work:
                    self._deliver(self.engine.step())
        except BaseException as err:           # noqa: BLE001 - reported to every waiting request
            log.exception("the engine worker stopped")
            self.failure = err
            self._fail_all(str(err) or type(err).__name__)
        finally:
            self.stopping.set()

    def _drain(self, block: bool) -> bool:
        """Apply every queued command (waiting for one when `block`). False once told to stop."""
        commands = self._collect(block)
        if self.control is not None:
            commands = self._publish(commands)
        return apply(self.engine, commands, self)

    def _collect(self, block: bool) -> list[tuple[str, Any]]:
        commands: list[tuple[str, Any]] = []
        while True:
            try:
                command, arg = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
            except queue.Empty:
                return commands
            block = False
            commands.append((command, arg))
            if command == "add":
                self.sinks[arg[0].id] = arg[1]
            if command == "stop":
                return commands

    def _publish(self, commands: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Send the batch to the follower ranks; a request whose record cannot travel as JSON
        unchanged fails here, alone, and is not sent."""
        sent, kept = [], []
        for command, arg in commands:
            if command == "add":
                request = arg[0]
                record = request_record(request)
                if request_from_record(record) != request:
                    self._deliver([_failed(request, "this decode record cannot be sent to the "
                                                    "other tensor-parallel ranks as JSON")])
                    continue
                sent.append(["add", record])
            else:
                sent.append([command, arg])
            kept.append((command, arg))
        self.control.publish(sent)
        return kept

    def handle_add_error(self, request: Request, message: str) -> None:
        self._deliver([_failed(request, message)])

    def handle_stop(self) -> None:
        self._deliver(self.engine.step() if self.engine.pending else [])

    def _deliver(self, updates: list[Update]) -> None:
        for update in updates:
            sink = self.sinks.pop(update.request_id, None) if update.finished else \
                self.sinks.get(update.request_id)
            if sink is None:
                continue
            try:
                sink(update)
            except Exception:                  # a closed client must not stop the engine
                log.exception("delivering an update failed")

    def _fail_all(self, message: str) -> None:
        for request_id, sink in list(self.sinks.items()):
            try:
                sink(Update(request_id, output=Output(None, (), 0, 0, 0.0, 0.0, "error", message)))
            except Exception:
                log.exception("delivering an update failed")
        self.sinks.clear()


class _Follower:
    """The command handlers of a follower rank: failures and updates are rank 0's to report."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def handle_add_error(self, request: Request, message: str) -> None:
        pass

    def handle_stop(self) -> None:
        if self.engine.pending:
            self.engine.step()


def apply(engine: Engine, commands: list[tuple[str, Any]], handler: Any) -> bool:
    """Apply a batch of commands to `engine` in order (the same on every rank). False on stop."""
    for command, arg in commands:
        if command == "add":
            request = arg[0]
            try:
                engine.add(request)
            except ValueError as err:
                handler.handle_add_error(request, str(err))
        elif command == "cancel":
            engine.cancel(arg)
        elif command == "cancel_all":
            for request_id in list(engine.lives):
                engine.cancel(request_id)
        elif command == "stop":
            for request_id in list(engine.lives):
                engine.cancel(request_id)
            handler.handle_stop()
            return False
    return True


def follow(engine: Engine, control: Any) -> None:
    """A follower rank's serving loop: apply each command batch TP rank 0 publishes, step the
    engine when it has work (the updates are dropped: rank 0 answers), return on stop."""
    handler = _Follower(engine)
    while True:
        commands = [(command, (request_from_record(arg), None) if command == "add" else arg)
                    for command, arg in control.receive()]
        if not apply(engine, commands, handler):
            return
        if engine.has_work:
            engine.step()


def request_record(request: Request) -> dict[str, Any]:
    """A request as JSON (`request_from_record` reads it back)."""
    return {"id": request.id, "prompt": list(request.prompt), "config": request.config.to_dict(),
            "max_tokens": request.max_tokens, "provisional": request.provisional, "adapter": request.adapter,
            "follow": request.follow}


def request_from_record(record: dict[str, Any]) -> Request:
    from dllm_decode.config import DecodeConfig

    return Request(record["id"], tuple(record["prompt"]), DecodeConfig.from_dict(record["config"]),
                   record["max_tokens"], record.get("provisional", False), record.get("adapter"),
                   record.get("follow", True))


def _failed(request: Request, message: str) -> Update:
    return Update(request.id, output=Output(None, (), len(request.prompt), 0, 0.0, 0.0, "error", message))


def startup_check(engine: Engine, config: Any, steps: int = 2) -> str | None:
    """Admit one tiny request with the server's default record and run its first `steps` engine
    steps before the server starts: a model/policy combination that cannot run (e.g. a scheduler
    that needs block bounds the model does not allow) fails here, once, instead of failing every
    request. Returns the error's message, or None when it runs. Leaves the engine empty.
    """
    model = engine.model
    vocab = int(getattr(model, "vocab_size", 2) or 2)
    special = {getattr(model, "mask_token_id", None), *getattr(model, "eos_token_ids", ())}
    token = next((i for i in range(vocab) if i not in special), 0)
    request = Request(id="startup-check", prompt=(token,), config=config, max_tokens=1)
    quiet = logging.getLogger(type(engine).__module__)      # the failure is reported once, here
    was, quiet.disabled = quiet.disabled, True
    try:
        engine.check(request)
        engine.add(request)
        for _ in range(steps):
            for update in engine.step():
                if update.output is not None and update.output.finish_reason == "error":
                    return update.output.error or "the decode failed"
            if not engine.has_work:
                return None
        engine.cancel(request.id)
        while engine.has_work:
            engine.step()
    except (ValueError, TypeError, RuntimeError) as err:
        return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    finally:
        quiet.disabled = was
    return None
