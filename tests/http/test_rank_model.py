"""A ranking-head GGUF served by the daemon, through the official openai client: a chat or a
completion asked of it is a 400 (it cannot generate), and it goes on serving embeddings. The
daemon has a system prompt longer than the encoder's positions: a generator would prefill it, a
ranking model leaves it (llama.cpp aborts the process on a position past a BERT's training context)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.daemon import Daemon, start_daemon
from tests.support.rank_gguf import write_rank_gguf


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon("--model", str(write_rank_gguf(tmp_path_factory.mktemp("rank") / "tiny-rank.gguf")),
                     "--n-parallel", "2", "--system", " ".join(["the cat sat on the mat ."] * 40))
    yield d
    assert d.stop() == 0


def test_generation_asked_of_a_ranking_model_is_a_400_and_it_keeps_serving(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{daemon.port}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="ranking model"):
        client.chat.completions.create(model="any", messages=[{"role": "user", "content": "the cat"}], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="ranking model"):
        client.completions.create(model="any", prompt="the cat sat", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="ranking model"):
        list(client.chat.completions.create(model="any", messages=[{"role": "user", "content": "the cat"}],
                                            max_tokens=4, stream=True))
    embedding = client.embeddings.create(model="any", input=["the cat sat", "paris is a city"])
    assert [len(e.embedding) for e in embedding.data] == [16, 16]
