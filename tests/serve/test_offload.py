"""`ServerState.offload`: a small body's work runs on the event loop, a big one's on the CPU
thread, and never two at once (tokenizers are not re-entrant)."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

from dllm_decode.serve.app import INLINE_BYTES, Limits, ServerState


def _state() -> ServerState:
    engine = SimpleNamespace(tokenizer=None, waiting=(), max_batch_size=1)
    return ServerState(SimpleNamespace(engine=engine), settings=None, limits=Limits())


def test_small_bodies_run_on_the_loop_and_big_ones_on_the_cpu_thread():
    state = _state()

    async def main():
        here = threading.current_thread().name
        assert await state.offload(lambda: threading.current_thread().name, size=INLINE_BYTES) == here
        big = await state.offload(lambda: threading.current_thread().name, size=INLINE_BYTES + 1)
        unsized = await state.offload(lambda: threading.current_thread().name)
        assert big.startswith("dllm-cpu") and unsized.startswith("dllm-cpu")

    asyncio.run(main())
    state.cpu.shutdown()


def test_a_small_body_waits_behind_work_already_on_the_cpu_thread():
    state = _state()
    running, log = threading.Event(), []

    def slow():
        running.set()
        time.sleep(0.2)
        log.append("big done")

    def small():
        log.append(f"small on {threading.current_thread().name}")

    async def main():
        big = asyncio.ensure_future(state.offload(slow, size=INLINE_BYTES + 1))
        while not running.is_set():
            await asyncio.sleep(0.005)
        await state.offload(small, size=10)
        await big
        assert state.offloaded == 0

    asyncio.run(main())
    state.cpu.shutdown()
    assert log[0] == "big done" and log[1].startswith("small on dllm-cpu")
