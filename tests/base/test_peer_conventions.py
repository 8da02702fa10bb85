"""llama-server's and vLLM's conventions on the daemon: tokenizer and template endpoints in both
shapes, routes without /v1, any model name on a one-model daemon, the peers' request extras, the
context-size error, and reasoning split out of a <think> block."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from llamactor.base.reasoning import ReasoningSplitter, split_reasoning

from tests.support.daemon import MODEL_ID, Daemon, start_daemon


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--n-parallel", "4")
    yield d
    d.stop()


def post(daemon: Daemon, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{daemon.url}{path}", json=body, timeout=60)


def test_tokenize_and_detokenize_answer_in_llama_server_and_vllm_shapes_alike(daemon: Daemon) -> None:
    llama = post(daemon, "/tokenize", {"content": "Hello world"}).json()
    vllm = post(daemon, "/tokenize", {"prompt": "Hello world", "add_special_tokens": False,
                                      "return_token_strs": True}).json()
    assert llama["tokens"] == vllm["tokens"] and vllm["count"] == len(vllm["tokens"]) >= 2
    assert "".join(vllm["token_strs"]) == "Hello world" and vllm["max_model_len"] > 0
    with_bos = post(daemon, "/v1/tokenize", {"prompt": "Hello world"}).json()["tokens"]
    assert with_bos[1:] == llama["tokens"] and len(with_bos) == len(llama["tokens"]) + 1
    pieces = post(daemon, "/tokenize", {"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == llama["tokens"] and "".join(p["piece"] for p in pieces) == "Hello world"
    back = post(daemon, "/detokenize", {"tokens": llama["tokens"]}).json()
    assert back == {"content": "Hello world", "prompt": "Hello world"}
    mixed = post(daemon, "/tokenize", {"content": ["Hello", llama["tokens"][-1]]}).json()["tokens"]
    assert mixed == llama["tokens"]


def test_tokenizer_info_is_what_lm_evaluation_harness_probes(daemon: Daemon) -> None:
    info = httpx.get(f"{daemon.url}/tokenizer_info", timeout=60).json()
    assert info["eos_token"] and info["bos_token"] and info["model_max_length"] > 0
    # lm-eval finds the EOS id by tokenizing its text without special tokens: it must be one id
    eos = post(daemon, "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False}).json()["tokens"]
    assert len(eos) == 1


def test_apply_template_renders_what_the_model_sees_and_refuses_two_trailing_assistant_turns(daemon: Daemon) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    prompt = post(daemon, "/apply-template", {"messages": messages}).json()["prompt"]
    assert "Hi" in prompt and prompt.rstrip().endswith("Assistant:")
    counted = post(daemon, "/tokenize", {"messages": messages}).json()["count"]
    usage = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="x").chat.completions.create(
        model=MODEL_ID, messages=messages, max_tokens=1).usage
    assert usage.prompt_tokens == counted
    two = messages + [{"role": "assistant", "content": "Hello"}, {"role": "assistant", "content": "again"}]
    refused = post(daemon, "/apply-template", {"messages": two})
    assert refused.status_code == 400 and "2 or more assistant" in refused.json()["error"]["message"]


def test_routes_without_v1_and_any_model_name_work_on_a_one_model_daemon(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=daemon.url, api_key="x")  # no /v1: llama-server's routes
    answer = client.chat.completions.create(model="gpt-3.5-turbo", messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=2)
    assert answer.model == MODEL_ID and answer.usage.completion_tokens >= 1
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_peer_extras_are_honoured_or_named_and_typos_refused(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="x")
    done = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=50,
                                     extra_body={"n_predict": 3, "id_slot": 2, "cache_prompt": True,
                                                 "repetition_penalty": 1.1})
    assert done.usage.completion_tokens == 3  # n_predict wins over max_tokens, as in llama-server
    assert any(e.get("event") == "request_fields_ignored" and e.get("fields") == ["id_slot"]
               for e in daemon.events("request_fields_ignored"))
    choice = client.completions.create(model=MODEL_ID, prompt="The answer is", max_tokens=8,
                                       extra_body={"guided_choice": [" yes", " no"]}).choices[0].text
    assert choice in (" yes", " no")
    with pytest.raises(openai.BadRequestError, match="temprature"):
        client.completions.create(model=MODEL_ID, prompt="hi", extra_body={"temprature": 1})


def test_a_prompt_over_the_context_is_exceed_context_size_error_streamed_or_not(daemon: Daemon) -> None:
    for stream in (False, True):
        r = post(daemon, "/v1/completions", {"model": MODEL_ID, "prompt": "word " * 4500, "max_tokens": 4,
                                             "stream": stream})
        error = r.json()["error"]
        assert r.status_code == 400 and error["type"] == "exceed_context_size_error"
        assert error["n_ctx"] == 4096 and error["n_prompt_tokens"] > 4096


@pytest.mark.pure
def test_a_think_block_is_split_from_the_answer_whole_or_streamed() -> None:
    answer = "<think>\nThe user greets me.\n</think>\n\nHello!"
    assert split_reasoning(answer) == ("The user greets me.", "Hello!")
    assert split_reasoning("Hello! <think>not at the start</think>") == (None, "Hello! <think>not at the start</think>")
    splitter = ReasoningSplitter()
    parts = [splitter.feed(answer[i:i + 3]) for i in range(0, len(answer), 3)] + [splitter.finish()]
    assert "".join(r for r, _ in parts).strip() == "The user greets me."
    assert "".join(c for _, c in parts).strip() == "Hello!"
    plain = ReasoningSplitter()
    assert [plain.feed("<b>bold</b>"), plain.finish()] == [("", "<b>bold</b>"), ("", "")]
