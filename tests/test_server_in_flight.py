"""InFlight, a stream's started batches: taken in the order added, at most a window of them
unanswered (the adder waits for room), the end after the last, and what was never taken given back."""
from __future__ import annotations

import asyncio

from dbvt_server.in_flight import END, InFlight


def test_items_come_in_order_and_the_end_after_them():
    async def main():
        in_flight = InFlight(4)
        taken = []

        async def take_all():
            while (item := await in_flight.take()) is not END:
                taken.append(item)
                in_flight.answered()

        taker = asyncio.create_task(take_all())
        for item in range(10):
            await in_flight.room()
            in_flight.add(item)
            if item % 3 == 0:
                await asyncio.sleep(0)      # the taker catches up now and then, and waits on an empty queue
        in_flight.end()
        await asyncio.wait_for(taker, 5)
        return taken

    assert asyncio.run(main()) == list(range(10))


def test_the_adder_waits_while_a_window_of_items_is_unanswered():
    async def main():
        in_flight = InFlight(2)
        for item in "ab":
            await in_flight.room()
            in_flight.add(item)
        waiting = asyncio.create_task(in_flight.room())
        await asyncio.sleep(0.01)
        assert not waiting.done(), "a third item would pass the window"
        assert await in_flight.take() == "a"
        await asyncio.sleep(0.01)
        assert not waiting.done(), "taken is not answered: the item still counts"
        in_flight.answered()
        await asyncio.wait_for(waiting, 5)

    asyncio.run(main())


def test_what_was_never_taken_is_left_without_the_end():
    async def main():
        in_flight = InFlight(4)
        for item in "abc":
            in_flight.add(item)
        in_flight.end()
        assert await in_flight.take() == "a"
        assert in_flight.left() == ["b", "c"]
        assert in_flight.left() == []

    asyncio.run(main())


def test_a_taker_cancelled_while_waiting_does_not_lose_the_next_item():
    async def main():
        in_flight = InFlight(4)
        cancelled = asyncio.create_task(in_flight.take())
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        in_flight.add("a")
        assert await asyncio.wait_for(in_flight.take(), 5) == "a"

    asyncio.run(main())
