"""The click CLI through CliRunner, and the chat REPL in a real pseudo-terminal (pexpect)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator

import pexpect
import pytest
from click.testing import CliRunner

from llamactor.cli.commands import main


def test_ask_prints_a_streamed_completion_and_json_on_request() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["ask", "The capital of France is", "--max-tokens", "6", "--temperature", "0"])
    assert result.exit_code == 0, result.output
    assert len(result.output.strip()) > 0
    as_json = runner.invoke(main, ["ask", "-", "--json", "--max-tokens", "4", "--temperature", "0"],
                            input="The capital of France is")
    data = json.loads(as_json.output)
    assert data["usage"]["completion_tokens"] == 4 and data["text"] and data["finish_reason"] == "length"


def test_ask_drafts_from_a_prediction_file_and_its_json_reports_the_drafted_tokens(tmp_path) -> None:
    runner = CliRunner()
    ask = ["ask", "def add(a, b):\n", "--json", "--max-tokens", "8", "--temperature", "0"]
    plain = json.loads(runner.invoke(main, ask).output)
    prediction = tmp_path / "prediction.py"
    prediction.write_text(plain["text"], encoding="utf-8")
    result = runner.invoke(main, [*ask, "--prediction-file", str(prediction)])
    assert result.exit_code == 0, result.output
    usage = json.loads(result.output)["usage"]
    assert usage["completion_tokens"] == 8 and 0 < usage["accepted_prediction_tokens"] <= 8
    assert usage["rejected_prediction_tokens"] >= 0
    missing = runner.invoke(main, [*ask, "--prediction-file", str(tmp_path / "none.py")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_options_come_from_the_environment_and_a_toml_config_file(tmp_path) -> None:
    config = tmp_path / "llamactor.toml"
    config.write_text('max_tokens = 3\ntemperature = 0.0\n')
    result = CliRunner().invoke(main, ["ask", "Hello", "--json", "--config", str(config)],
                                env={"LLAMACTOR_N_CTX": "1024"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["usage"]["completion_tokens"] == 3


def test_info_reports_the_model_its_context_and_the_backend_devices() -> None:
    result = CliRunner().invoke(main, ["info", "--n-ctx", "2048"])
    info = json.loads(result.output)
    assert info["n_ctx"] == 2048 and info["n_vocab"] == 262144
    assert info["chat_template"].startswith("transcript") and info["looks_like_base_model"] is True
    cpu = next(d for d in info["devices"] if d["type"] == "cpu")
    assert cpu["name"] == "CPU" and cpu["memory_total"] > 0 and 0 <= cpu["memory_free"] <= cpu["memory_total"]
    assert isinstance(info["gpu_offload"], bool) and info["n_gpu_layers"] == (-1 if info["gpu_offload"] else 0)


@pytest.mark.pure
def test_a_bad_model_path_is_a_one_line_error_not_a_traceback(tmp_path) -> None:
    result = CliRunner().invoke(main, ["ask", "hi", "--model", str(tmp_path / "missing.gguf")])
    assert result.exit_code != 0 and "model file not found" in result.output and "Traceback" not in result.output


@contextlib.contextmanager
def repl_session(*args: str) -> Iterator[pexpect.spawn]:
    """``llamactor chat`` (on its default model unless ``args`` name one), greedy, in a
    pseudo-terminal; killed if still running."""
    child = pexpect.spawn(sys.executable, ["-m", "llamactor.cli", "chat", "--n-ctx", "2048", "--temperature", "0", *args],
                          encoding="utf-8", timeout=60, dimensions=(40, 200))
    try:
        yield child
    finally:
        child.close(force=True)


def test_the_repl_opens_the_instruct_model_by_default_and_it_answers_a_factual_question_in_one_line() -> None:
    with repl_session() as child:
        child.expect("chat format: gguf")
        child.expect(r"Devices: [^\r\n]*CPU \([^\r\n]*GiB free")  # a GPU build lists its GPU first
        child.expect(">>> ")
        child.sendline("What is the capital of France?")
        child.expect("France\\?\r\n")  # the terminal's echo of the line
        child.expect(">>> ")  # the answer ended by itself (at the template's end-of-turn token)
        answer = child.before.strip()
        assert "Paris" in answer and "<|im_end|>" not in answer
        child.sendeof()


def test_the_repl_on_the_base_model_says_so_and_answers_through_the_transcript_in_one_line(model_path) -> None:
    with repl_session("--model", model_path) as child:
        child.expect("base \\(pretrained\\) model")
        child.expect(">>> ")
        child.sendline("What is the capital of France?")
        child.expect("France\\?\r\n")  # the terminal's echo of the line
        child.expect(">>> ")  # the answer ended by itself (before the default max_tokens, 256)
        answer = child.before.strip()
        assert "Paris" in answer and "\n" not in answer and "User:" not in answer
        child.sendeof()


def test_the_repl_answers_resets_sets_and_ctrl_c_cancels_the_answer() -> None:
    with repl_session() as child:
        child.expect(">>> ")
        child.sendline("/set max_tokens 5")
        child.expect(r"max_tokens = 5")
        child.expect(">>> ")
        child.sendline("Hello, who are you?")
        child.expect(">>> ")  # the (short) answer streamed, the prompt is back
        child.sendline("/stats")
        child.expect(r'"requests_finished": 1')
        child.sendline("/set temperature -3")
        child.expect("temperature must be")
        child.sendline("/set max_tokens 1900")  # the instruct template's default system message fills 60 tokens
        child.expect(">>> ")
        child.sendline("/set ignore_eos true")
        child.expect(">>> ")
        child.sendline("Write a very long story about the sea.")
        child.expect("sea.\r\n")  # the terminal's echo of the line
        child.expect(r"\S")  # the answer has started streaming
        child.sendintr()
        child.expect(r"\(stopped\)")
        child.expect(">>> ")
        child.sendline("/stats")
        child.expect(r'"running": 0')
        child.sendline("/reset")
        child.expect(r"conversation cleared")
        child.sendeof()
        child.expect(pexpect.EOF)
    assert child.exitstatus == 0
