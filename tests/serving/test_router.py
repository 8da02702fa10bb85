"""Several models and replicas behind one ``Router``, on the real engine (policies alone: test_routing.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import llamactor
from llamactor.base.errors import BatcherUnavailableError
from llamactor.handles.llm import start_tree
from llamactor.serving import replicas as replicas_module

from tests.conftest import NotAMessage, batcher_ref, closing_what_the_test_started, record_sent

SMALL = {"n_parallel": 2, "n_ctx": 1024, "n_threads": 1}
HISTORY = [{"role": "user", "content": "You are a careful assistant. Describe the sea in three sentences, "
                                       "with its colour, its sound and its smell, and nothing else."}]


@pytest.fixture
def start_router(model_path: str) -> Iterator[object]:
    """Start a router; it and every actor the test started are stopped after the test."""
    with closing_what_the_test_started() as routers:
        def start(*models: dict[str, object], **options: object) -> llamactor.Router:
            routers.append(llamactor.start(models=[{"path": model_path, **SMALL, **m} for m in models], **options))
            return routers[-1]

        yield start


def test_two_models_answer_under_their_own_names_and_an_unknown_name_is_refused(start_router) -> None:
    router = start_router({"name": "plain"}, {"name": "pirate", "system_prompt": "Answer like a pirate."})
    assert router.names == ["plain", "pirate"]
    plain = router["plain"].chat(HISTORY, max_tokens=6, temperature=0)
    pirate = router["pirate"].chat(HISTORY, max_tokens=6, temperature=0)
    assert pirate.usage.prompt_tokens > plain.usage.prompt_tokens  # the pirate's system prompt is in its prompt
    assert router.model() is router["plain"]  # the first model is the default
    with pytest.raises(llamactor.ModelNotFoundError, match="'poet' does not exist"):
        router["poet"]


def test_gemma_and_smollm2_serve_side_by_side_each_through_its_own_vocabulary_and_template(
        start_router, instruct_path: str) -> None:
    router = start_router({"name": "gemma"}, {"name": "smol", "path": instruct_path})
    gemma, smol = router["gemma"], router["smol"]
    assert (gemma.info.n_vocab, smol.info.n_vocab) == (262144, 49152)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    running = [smol.submit_chat(question, max_tokens=12, temperature=0),
               gemma.submit("The capital of France is", max_tokens=4, temperature=0)]
    answer, text = (f.result(timeout=120) for f in running)  # both at once, each on its own tree
    assert "Paris" in answer.text and text.usage.completion_tokens == 4
    assert smol.tokenize("The sea").token_ids != gemma.tokenize("The sea").token_ids
    assert smol.tokenize(question).text.startswith("<|im_start|>")  # SmolLM2's ChatML; Gemma base has none
    assert "<|im_start|>" not in gemma.tokenize(question).text
    assert [router.status(n).value for n in router.names] == ["loaded", "loaded"]


@pytest.mark.parametrize("which", ["gemma", "smol"])
def test_shortest_queue_sends_new_work_to_the_idle_replica(start_router, which: str, instruct_path: str) -> None:
    chat = start_router({"name": "chat", "replicas": 2, **({"path": instruct_path} if which == "smol" else {})})["chat"]
    busy = chat.submit("Once upon a time", request_id="long-story", max_tokens=400, ignore_eos=True)
    first = chat.served.index(1)
    quick = chat.ask("The sea is", max_tokens=4)
    assert chat.served[1 - first] == 1 and not busy.done()  # the idle replica took it while the other was busy
    assert quick.usage.completion_tokens == 4
    chat.cancel("long-story")  # reaches the replica that holds it
    with pytest.raises(llamactor.CancelledError):
        busy.result(timeout=60)


def test_prefix_affinity_sends_the_next_turn_to_the_replica_that_served_the_previous_one(start_router) -> None:
    chat = start_router({"name": "chat", "replicas": 2, "policy": "prefix_affinity"})["chat"]
    first = chat.chat(HISTORY, max_tokens=12, temperature=0)
    served_first = chat.served.index(1)
    for other in ("list three fruits, in one line.", "name two rivers, in one line."):
        # balanced queues and no shared prefix: the rotation picks, once each replica
        chat.chat([{"role": "user", "content": f"Something else entirely: {other}"}], max_tokens=4)
    history = [*HISTORY, {"role": "assistant", "content": first.text}, {"role": "user", "content": "And at night?"}]
    before = list(chat.served)
    second = chat.chat(history, max_tokens=8, temperature=0)
    assert chat.served[served_first] == before[served_first] + 1
    assert second.usage.cached_tokens >= first.usage.prompt_tokens - 1  # that replica still held the first turn


def test_a_crashed_replica_restarts_without_disturbing_the_other(start_router) -> None:
    chat = start_router({"name": "chat", "replicas": 2})["chat"]
    running = [chat.submit(f"Story number {i}:", max_tokens=40, temperature=0, ignore_eos=True) for i in range(4)]
    assert sorted(chat.served) == [2, 2]
    batcher_ref(chat.replica(0)).tell(NotAMessage())
    assert all(f.result(timeout=120).usage.completion_tokens == 40 for f in running)  # replayed on replica 0
    stats = chat.replica_stats()
    assert [s["restarts"] for s in stats] == [1, 0] and [s["state"] for s in stats] == ["ready", "ready"]
    assert chat.ask("After the crash", max_tokens=3).usage.completion_tokens == 3


def test_a_model_loads_on_first_use_and_max_loaded_unloads_the_least_recently_used(start_router,
                                                                                  instruct_path: str) -> None:
    router = start_router({"name": "a"}, {"name": "b", "path": instruct_path, "preload": False},
                          {"name": "c", "preload": False}, max_loaded=2)
    assert [m.loaded for m in router] == [True, False, False]
    assert [router.status(n).value for n in router.names] == ["loaded", "unloaded", "unloaded"]
    router["b"].ask("Hello", max_tokens=2)
    assert [m.loaded for m in router] == [True, True, False]
    router["a"].ask("Hello", max_tokens=2)  # now b is the least recently used
    router["c"].ask("Hello", max_tokens=2)
    assert [m.loaded for m in router] == [True, False, True]
    assert router.stats()["b"]["state"] == "unloaded"
    assert [router.status(n).value for n in router.names] == ["loaded", "unloaded", "loaded"]
    assert router.status("b").loads == 1 and router.describe("b")["path"] == instruct_path


def test_a_model_reads_loading_while_its_trees_start_then_loaded(start_router, instruct_path: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    router = start_router({"name": "gemma"}, {"name": "smol", "path": instruct_path, "preload": False})
    starting, go = threading.Event(), threading.Event()

    def held_start_tree(config: object) -> object:  # the real load, once the test has looked
        starting.set()
        assert go.wait(60)
        return start_tree(config)

    monkeypatch.setattr(replicas_module, "start_tree", held_start_tree)
    loader = threading.Thread(target=router.load, args=("smol",))
    loader.start()
    assert starting.wait(60)
    assert router.describe("smol")["status"] == {"value": "loading"} and not router["smol"].loaded
    go.set()
    loader.join(120)
    assert router.describe("smol")["status"] == {"value": "loaded"} and router["smol"].loaded


def test_a_pinned_model_loads_at_start_and_stays_loaded(start_router, instruct_path: str) -> None:
    router = start_router({"name": "smol", "path": instruct_path, "pin": True, "preload": False, "idle_unload_s": 1},
                          {"name": "gemma", "preload": False}, max_loaded=1)
    assert router["smol"].loaded and router.describe("smol")["pinned"]  # pinned: loaded whatever preload says
    with pytest.raises(BatcherUnavailableError, match="busy or pinned"):
        router["gemma"].ask("Hello", max_tokens=2)  # the one slot is the pinned model's
    assert router.unload_idle(now=router["smol"].last_used + 3600) == []
    with pytest.raises(llamactor.InvalidRequestError, match="pinned"):
        router.unload("smol")
    router["smol"].unload()  # as Ollama's keep_alive 0 asks: a pinned model stays
    assert router["smol"].loaded and router.status("smol").value == "loaded"
    with pytest.raises(llamactor.InvalidRequestError, match="exceed max_loaded"):
        llamactor.start(models=[{"name": "a", "pin": True}, {"name": "b", "pin": True}], max_loaded=1)


def test_a_model_that_fails_to_load_says_which_file_and_why_and_the_others_keep_serving(
        start_router, tmp_path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a model")
    router = start_router({"name": "gemma"}, {"name": "broken", "path": str(broken), "preload": False})
    with pytest.raises(llamactor.ModelLoadError, match="'broken' could not be loaded from .*broken.gguf.*header"):
        router["broken"].ask("Hello", max_tokens=2)
    assert router.describe("broken")["status"]["failed"] is True and router.status("broken").value == "unloaded"
    assert router["gemma"].ask("Hello", max_tokens=2).usage.completion_tokens == 2


def test_a_model_asking_for_more_sequences_than_it_holds_raises_the_typed_error_as_raised(start_router) -> None:
    """Not a ``ModelLoadError`` around it: the caller reads its class, its message and its limit."""
    router = start_router({"name": "gemma"}, {"name": "crowded", "n_parallel": 127, "preload": False})
    with pytest.raises(llamactor.SequenceLimitError, match=r"^gemma.*holds at most 128 .*n_parallel=127") as refused:
        router["crowded"].ask("Hello", max_tokens=2)
    assert type(refused.value) is llamactor.SequenceLimitError and refused.value.code == "sequence_limit"
    assert refused.value.details == {"max_sequences": 128, "model": "crowded", "path": router["crowded"].path}
    assert router.describe("crowded")["status"]["failed"] is True
    assert router["gemma"].ask("Hello", max_tokens=2).usage.completion_tokens == 2


def test_a_model_idle_longer_than_idle_unload_s_is_unloaded_and_loads_again(start_router) -> None:
    router = start_router({"name": "a", "idle_unload_s": 3600})
    assert router.unload_idle() == []
    busy = router["a"].submit("Once upon a time", max_tokens=200, ignore_eos=True)
    assert router.unload_idle(now=router["a"].last_used + 7200) == []  # never while a request is in flight
    busy.result(timeout=60)
    assert router.unload_idle(now=router["a"].last_used + 7200) == ["a"] and not router["a"].loaded
    assert router["a"].ask("Back again", max_tokens=2).usage.completion_tokens == 2


def test_max_loaded_models_all_busy_refuse_another_with_unavailable(start_router) -> None:
    router = start_router({"name": "a"}, {"name": "b", "preload": False}, max_loaded=1)
    busy = router["a"].submit("Once upon a time", request_id="busy", max_tokens=300, ignore_eos=True)
    with pytest.raises(BatcherUnavailableError, match="max_loaded"):
        router["b"].ask("Hello", max_tokens=2)
    router["a"].cancel("busy")
    with pytest.raises(llamactor.CancelledError):
        busy.result(timeout=60)


def test_the_n_choices_of_one_prompt_go_to_one_replica_seeded_seed_plus_i(start_router,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    model = start_router({"name": "m", "replicas": 2, "n_parallel": 4})["m"]
    sent = [record_sent(model.replica(i), monkeypatch) for i in (0, 1)]  # what each replica's tree is handed
    choices = model.ask("Once upon a time in a harbour town", n=3, request_id="tale", max_tokens=6, temperature=0.9,
                        seed=5, ignore_eos=True)
    stats = model.replica_stats(exact=True)
    assert sorted(s["served"] for s in stats) == [0, 1]  # one routing decision for all three
    chosen = [s["served"] for s in stats].index(1)
    assert [(m.request_id, m.params.seed) for m in sent[chosen]] == [("tale-0", 5), ("tale-1", 6), ("tale-2", 7)]
    assert sent[1 - chosen] == [] and [c.request_id for c in choices] == ["tale-0", "tale-1", "tale-2"]
    # served there, the prompt computed once (a fresh tree: nothing cached); each sibling computed its last token
    n_prompt = choices[0].usage.prompt_tokens
    assert [stats[chosen]["tokens_generated"], stats[1 - chosen]["tokens_generated"]] == [18, 0]
    assert [stats[chosen]["prompt_tokens_computed"], stats[1 - chosen]["prompt_tokens_computed"]] == [n_prompt + 2, 0]
