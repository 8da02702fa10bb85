"""Special-token text in raw prompts through the real daemon, with the official clients, on both
bundled models (``gemma``: the base Gemma, ``smol``: SmolLM2-135M-Instruct): a client-rendered
ChatML prompt on ``/v1/completions`` answers as llama-cpp-python's ``create_completion`` of the
same text and counts the same prompt tokens; a Gemma turn marker costs its one token;
``parse_special: false`` restores the plain-text reading; Ollama's raw generate and a batch line
read it alike; a non-bool ``parse_special`` is the dialect's 400."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import ollama
import openai
import pytest

from tests.support.batch_api import finished, jsonl, lines_of, upload
from tests.support.daemon import (
    Daemon, assert_same_greedy_text_up_to_near_tie, legacy_result, legacy_steps, start_daemon,
)

CHATML = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
GEMMA_TURN = "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
PROMPTS = {"smol": CHATML, "gemma": GEMMA_TURN}
GREEDY = {"temperature": 0, "max_tokens": 16}
NO_PENALTY = {"repeat_penalty": 1.0}  # llama-cpp-python's create_completion is told the same


@pytest.fixture(scope="module")
def daemon(model_path: str, instruct_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon("--model", f"gemma={model_path}", "--model", f"smol={instruct_path}", "--n-parallel", "2",
                     "--data-dir", str(tmp_path_factory.mktemp("data")))
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def paths(model_path: str, instruct_path: str) -> dict[str, str]:
    return {"gemma": model_path, "smol": instruct_path}


def counted(path: str, text: str, special: bool) -> int:
    """How many tokens llama-cpp-python makes of ``text`` as ``create_completion`` does (BOS as the
    vocabulary adds it; ``special``: special-token text parsed, as create_completion parses it)."""
    return len(llama_cpp.Llama(path, vocab_only=True, verbose=False).tokenize(text.encode(), add_bos=True,
                                                                              special=special))


@pytest.mark.timeout(300)  # the daemon's two models and the reference's own model load first
def test_a_client_rendered_chatml_prompt_answers_as_llama_cpp_pythons_create_completion(
        daemon: Daemon, instruct_path: str) -> None:
    ours = daemon.client().completions.create(model="smol", prompt=CHATML, logprobs=2, extra_body=NO_PENALTY,
                                              **GREEDY)  # type: ignore[call-overload]
    reference = llama_cpp.Llama(instruct_path, n_ctx=512, logits_all=True, verbose=False, n_threads=2)
    try:
        theirs = reference.create_completion(CHATML, logprobs=2, repeat_penalty=1.0, **GREEDY)
    finally:
        reference.close()
    [choice], usage = theirs["choices"], theirs["usage"]  # type: ignore[index]
    assert ours.usage is not None and ours.usage.prompt_tokens == usage["prompt_tokens"]
    assert_same_greedy_text_up_to_near_tie(
        legacy_result(ours.choices[0]),
        (choice["text"], legacy_steps(choice["logprobs"]["tokens"], choice["logprobs"]["top_logprobs"]),
         choice["finish_reason"]))
    assert "Paris" in ours.choices[0].text and "<|im" not in ours.choices[0].text


@pytest.mark.parametrize("model", ["smol", "gemma"])
def test_completions_count_special_text_as_its_tokens_unless_parse_special_is_false(
        daemon: Daemon, paths: dict[str, str], model: str) -> None:
    client, prompt = daemon.client(), PROMPTS[model]

    def prompt_tokens(text: str, **extra: object) -> int:
        usage = client.completions.create(model=model, prompt=text, max_tokens=1, extra_body=extra).usage
        assert usage is not None
        return usage.prompt_tokens

    assert prompt_tokens(prompt) == counted(paths[model], prompt, special=True)
    assert prompt_tokens(prompt, parse_special=False) == counted(paths[model], prompt, special=False)
    marker = prompt.split("\n")[0].removesuffix("user")  # <|im_start|> or <start_of_turn>
    n_bos = counted(paths[model], "", special=True)
    assert prompt_tokens(marker) == n_bos + 1 < prompt_tokens(marker, parse_special=False)
    if model == "gemma":  # <bos> written by the client: one BOS, not two
        assert prompt_tokens("<bos>" + prompt) == prompt_tokens(prompt)
    with pytest.raises(openai.BadRequestError, match="parse_special"):
        client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body={"parse_special": "false"})


@pytest.mark.parametrize("model", ["smol", "gemma"])
def test_ollamas_raw_generate_reads_special_text_and_options_can_turn_it_off(
        daemon: Daemon, paths: dict[str, str], model: str) -> None:
    client, prompt = ollama.Client(host=daemon.url), PROMPTS[model]
    greedy = {"temperature": 0, "num_predict": 12}
    parsed = client.generate(model=model, prompt=prompt, raw=True, options=greedy)
    assert parsed.prompt_eval_count == counted(paths[model], prompt, special=True)
    if model == "smol":
        assert "Paris" in parsed.response and "<|im" not in parsed.response
    plain = client.generate(model=model, prompt=prompt, raw=True, options={**greedy, "parse_special": False})
    assert plain.prompt_eval_count == counted(paths[model], prompt, special=False)
    with pytest.raises(ollama.ResponseError) as refused:
        client.generate(model=model, prompt=prompt, raw=True, options={**greedy, "parse_special": "no"})
    assert refused.value.status_code == 400


def test_a_batch_line_for_completions_reads_special_text_as_the_endpoint_does(
        daemon: Daemon, instruct_path: str) -> None:
    client = daemon.client()
    lines = [{"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
              "body": {"model": "smol", "prompt": CHATML, **GREEDY, **extra}}
             for custom_id, extra in (("parsed", {}), ("plain", {"parse_special": False}))]
    batch = client.batches.create(input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions",
                                  completion_window="24h")
    done = finished(daemon, batch.id)
    bodies = {line["custom_id"]: line["response"]["body"] for line in lines_of(client, done.output_file_id)}
    assert bodies["parsed"]["usage"]["prompt_tokens"] == counted(instruct_path, CHATML, special=True)
    assert bodies["plain"]["usage"]["prompt_tokens"] == counted(instruct_path, CHATML, special=False)
    direct = client.completions.create(model="smol", prompt=CHATML, **GREEDY)  # type: ignore[call-overload]
    assert bodies["parsed"]["choices"][0]["text"] == direct.choices[0].text or "Paris" in bodies["parsed"][
        "choices"][0]["text"]
