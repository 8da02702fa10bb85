"""The supervisor restarts a crashed batcher and loses nothing that can be replayed."""

from __future__ import annotations

import pytest

from llamactor import BatcherUnavailableError

from tests.conftest import NotAMessage, batcher_ref


def test_a_crashed_batcher_is_restarted_and_a_queued_request_still_completes(start_llm) -> None:
    llm = start_llm(n_parallel=2, batch_size=8, batch_timeout_ms=300)
    queued = llm.submit("Hello there", max_tokens=4, temperature=0, ignore_eos=True)  # waits for its window
    batcher_ref(llm).tell(NotAMessage())
    right_after = [llm.submit(f"Right after the crash {i}", max_tokens=2) for i in range(4)]  # may meet the dead ref
    completion = queued.result(timeout=60)
    assert completion.usage.completion_tokens == 4
    assert all(f.result(timeout=60).usage.completion_tokens <= 2 for f in right_after)
    stats = llm.stats()
    assert stats["restarts"] == 1 and stats["generation"] == 2 and stats["state"] == "ready"


def test_mid_generation_requests_and_started_streams_resume_on_the_restarted_batcher(start_llm) -> None:
    llm = start_llm(n_parallel=2, batch_timeout_ms=5)
    expected = llm.ask("The sea is", max_tokens=30, temperature=0, ignore_eos=True)
    plain = llm.submit("The sea is", max_tokens=30, temperature=0, ignore_eos=True)
    stream = llm.stream("Once upon a time", max_tokens=40, temperature=0, ignore_eos=True)
    pieces = iter(stream)
    first = next(pieces)  # both are running now: they were admitted in the same step
    batcher_ref(llm).tell(NotAMessage())
    rest = list(pieces)  # no BatcherRestartedError: the stream goes on from its checkpoint
    assert first + "".join(rest) == stream.completion.text and stream.completion.usage.completion_tokens == 40
    rerun = plain.result(timeout=60)
    assert rerun.usage.completion_tokens == 30 and rerun.usage.prompt_tokens == expected.usage.prompt_tokens
    assert llm.stats()["restarts"] == 1


def test_the_supervisor_gives_up_after_max_restarts_and_every_caller_gets_unavailable(start_llm) -> None:
    llm = start_llm(n_parallel=1, max_restarts=0, batch_size=8, batch_timeout_ms=60_000)
    waiting = llm.submit("never", max_tokens=4)
    batcher_ref(llm).tell(NotAMessage())
    with pytest.raises(BatcherUnavailableError, match="failed"):
        waiting.result(timeout=30)
    with pytest.raises(BatcherUnavailableError):
        llm.ask("after giving up", timeout=30)
    assert llm.stats()["state"] == "failed"


def test_a_model_that_cannot_be_loaded_fails_start_with_a_one_line_reason(tmp_path) -> None:
    import llamactor

    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"GGUF but not really")
    with pytest.raises(llamactor.ModelLoadError, match="could not load"):
        llamactor.start(str(bogus))
    with pytest.raises(llamactor.ModelLoadError, match="not found"):
        llamactor.start(str(tmp_path / "missing.gguf"))
