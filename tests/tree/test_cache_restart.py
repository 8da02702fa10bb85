"""The disk tier on the real model: a closed tree, and a daemon stopped with SIGTERM, leave their
cached prefixes in ``cache_dir``; the next start finds them by token prefix. Damaged files cost a
recomputation, never a wrong answer."""

from __future__ import annotations

from pathlib import Path

from llamactor.native.engine import Engine

from tests.conftest import assert_equal_up_to_near_tie
from tests.support.chat_prompts import PERSONA, chat_tokens
from tests.support.daemon import MODEL_ID, start_daemon


def turns(first_answer: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    turn1 = [{"role": "system", "content": PERSONA}, {"role": "user", "content": "Which ship did you sail in 1853?"}]
    return turn1, turn1 + [{"role": "assistant", "content": first_answer},
                           {"role": "user", "content": "And what did it carry?"}]


def test_a_restarted_tree_finds_its_conversation_in_the_cache_directory_and_answers_as_recomputed(
        start_llm, tmp_path: Path, reference_engine: Engine) -> None:
    options = dict(n_parallel=2, n_ctx=2048, cache_dir=str(tmp_path), cache_ram_mib=64)
    before = start_llm(**options)
    turn1, _ = turns("")
    first = before.chat(turn1, max_tokens=24, temperature=0)
    before.close()  # a clean shutdown writes what is cached
    assert len(list(tmp_path.glob("*.kv"))) == 1 and not list(tmp_path.glob("*.tmp"))

    after = start_llm(**options)
    _, turn2 = turns(first.text)
    second = after.chat(turn2, max_tokens=24, temperature=0)
    assert second.usage.cached_tokens >= first.usage.prompt_tokens
    tiers = after.stats()["cache_ram"]
    assert tiers["disk"]["loaded"] == 1 and tiers["restored"] == 1
    uncached = start_llm(n_parallel=1, n_ctx=2048, prefix_cache=False).chat(turn2, max_tokens=24, temperature=0)
    assert_equal_up_to_near_tie(reference_engine, chat_tokens(reference_engine, turn2), second, uncached)


def test_damaged_or_foreign_cache_files_are_removed_and_the_prompt_recomputed(
        start_llm, tmp_path: Path, reference_engine: Engine) -> None:
    options = dict(n_parallel=2, n_ctx=2048, cache_dir=str(tmp_path))
    turn1, _ = turns("")
    writer = start_llm(**options)
    first = writer.chat(turn1, max_tokens=24, temperature=0)
    writer.close()
    [path] = tmp_path.glob("*.kv")
    data = bytearray(path.read_bytes())
    data[-1000] ^= 0xFF  # one byte of KV flipped: only the checksum can tell
    path.write_bytes(bytes(data))

    reader = start_llm(**options)
    again = reader.chat(turn1, max_tokens=24, temperature=0)
    assert again.usage.cached_tokens == 0 and not path.exists()
    assert reader.stats()["cache_ram"]["disk"]["removed_invalid"] == 1
    assert_equal_up_to_near_tie(reference_engine, chat_tokens(reference_engine, turn1), first, again)
    reader.close()
    [written] = tmp_path.glob("*.kv")  # the reader's own, valid entry

    other = start_llm(**{**options, "n_ctx": 4096})  # other settings: the file is not valid for them
    disk = other.stats()["cache_ram"]["disk"]
    assert (disk["entries"], disk["removed_invalid"]) == (0, 1)
    assert not written.exists()


def test_a_daemon_stopped_with_sigterm_finds_its_cache_when_started_again(tmp_path: Path) -> None:
    args = ("--n-parallel", "2", "--cache-dir", str(tmp_path))
    turn1, _ = turns("")
    daemon = start_daemon(*args)
    try:
        first = daemon.client().chat.completions.create(model=MODEL_ID, messages=turn1, max_tokens=24, temperature=0)
    finally:
        assert daemon.stop() == 0
    assert len(list(tmp_path.glob("*.kv"))) == 1

    daemon = start_daemon(*args)
    try:
        assert daemon.wait_for_log(lambda line: line.get("event") == "disk_tier_opened" and line["entries"] == 1)
        _, turn2 = turns(first.choices[0].message.content or "")
        second = daemon.client().chat.completions.create(model=MODEL_ID, messages=turn2, max_tokens=8, temperature=0)
        assert second.usage is not None and second.usage.prompt_tokens_details is not None
        assert first.usage is not None
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    finally:
        assert daemon.stop() == 0
