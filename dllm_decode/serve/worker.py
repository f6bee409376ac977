"""`EngineWorker`: the one thread that owns the `Engine` and does all torch work.

The web server's event loop never runs a model: it submits requests and cancellations through a
thread-safe inbox and receives each request's `Update`s through a callback (`sink`), which the
server turns into an `asyncio.Queue` put with `loop.call_soon_threadsafe`. The worker sleeps on
the inbox while the engine has no work and steps it otherwise.
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
    """

    def __init__(self, engine: Engine, threads: int | None = None):
        self.engine = engine
        self.threads = threads
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
        while True:
            try:
                command, arg = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
            except queue.Empty:
                return True
            block = False
            if command == "add":
                request, sink = arg
                self.sinks[request.id] = sink
                try:
                    self.engine.add(request)
                except ValueError as err:
                    self._deliver([_failed(request, str(err))])
            elif command == "cancel":
                self.engine.cancel(arg)
            elif command == "cancel_all":
                for request_id in list(self.engine.lives):
                    self.engine.cancel(request_id)
            elif command == "stop":
                for request_id in list(self.engine.lives):
                    self.engine.cancel(request_id)
                self._deliver(self.engine.step() if self.engine.pending else [])
                return False

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
