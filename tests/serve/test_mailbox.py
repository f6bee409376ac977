"""`serve.mailbox.Mailbox`: the engine thread's updates reach the event loop in order, with one
wake-up per burst rather than one per update."""

from __future__ import annotations

import asyncio
import threading

from dllm_decode.serve.mailbox import Mailbox


def test_a_burst_from_another_thread_arrives_in_order_with_one_wake_up():
    async def main():
        loop = asyncio.get_running_loop()
        box, queues = Mailbox(loop), [asyncio.Queue(), asyncio.Queue()]
        wakes = []
        original = loop.call_soon_threadsafe

        def counted(callback, *args):
            wakes.append(callback)
            return original(callback, *args)

        loop.call_soon_threadsafe = counted
        burst = threading.Thread(target=lambda: [box.post(queues[i % 2], i) for i in range(100)])
        burst.start()
        burst.join()                      # the loop is not running meanwhile: one pending wake-up
        got = [[await asyncio.wait_for(q.get(), 5) for _ in range(50)] for q in queues]
        assert got == [list(range(0, 100, 2)), list(range(1, 100, 2))]
        assert len(wakes) == 1
        box.post(queues[0], "later")      # after the drain, the next post wakes the loop again
        assert await asyncio.wait_for(queues[0].get(), 5) == "later" and len(wakes) == 2

    asyncio.run(main())
