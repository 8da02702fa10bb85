"""asyncio: many tasks stream from one model at once."""

import asyncio

import llamactor


async def main() -> None:
    with llamactor.start(n_parallel=4) as llm:
        async def one(topic: str) -> str:
            pieces = [p async for p in llm.stream_async(f"A short poem about {topic}:\n", max_tokens=40)]
            return f"--- {topic}\n{''.join(pieces)}"

        for text in await asyncio.gather(*(one(t) for t in ("rain", "cats", "trains", "bread"))):
            print(text)


asyncio.run(main())
