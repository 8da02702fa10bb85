"""The sampling the chat REPL and ``info`` use, and say they use: the operator's options over the
GGUF's recommendation over the REPL's own defaults over llamactor's, on the bundled instruct model
and on a copy of it whose GGUF recommends sampling."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pexpect
import pytest
from click.testing import CliRunner

from llamactor.cli.commands import main
from llamactor.cli.repl import CHAT_DEFAULTS, Repl
from tests.support.gguf_copies import with_sampling

RECOMMENDED = {"top_p": 0.8, "min_p": 0.2}  # top_p over the REPL's 0.9; temperature left to the REPL


@pytest.fixture(scope="module")
def recommending(tmp_path_factory: pytest.TempPathFactory, instruct_path: str) -> str:
    return str(with_sampling(instruct_path, tmp_path_factory.mktemp("gguf") / "smollm2.gguf", RECOMMENDED))


def test_info_shows_the_default_sampling_and_where_each_value_comes_from(recommending: str) -> None:
    result = CliRunner().invoke(main, ["info", "--model", recommending, "--n-ctx", "1024", "--n-threads", "1",
                                       "--top-k", "7"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["gguf_sampling"] == {"top_p": 0.8, "min_p": 0.2} and info["gguf_sampling_unused"] == {}
    assert info["sampling"]["top_p"] == {"value": 0.8, "source": "model"}
    assert info["sampling"]["top_k"] == {"value": 7, "source": "operator"}
    assert info["sampling"]["temperature"] == {"value": 0.8, "source": "llamactor"}


@pytest.fixture
def repl(start_llm, recommending: str) -> Iterator[Repl]:
    yield Repl(start_llm(model=recommending, n_threads=1, repeat_penalty=1.0))


def test_a_question_in_the_repl_gets_the_repls_defaults_under_the_gguf_and_the_operator(repl: Repl) -> None:
    values = repl.request_values()
    assert values == {"temperature": CHAT_DEFAULTS["temperature"], "top_p": 0.8}  # the GGUF's top_p
    params = repl.llm.request(messages=[{"role": "user", "content": "hi"}], **values).params
    assert (params.temperature, params.top_p, params.min_p, params.top_k) == (0.2, 0.8, 0.2, 40)
    repl.set_param("top_p 0.5")
    assert repl.request_values()["top_p"] == 0.5
    line = repl.sampling_line()
    assert "temperature 0.2 (chat)" in line and "top_p 0.5 (/set)" in line and "min_p 0.2 (model)" in line
    assert "repeat_penalty 1.0 (operator)" in line and "top_k 40," in line


def test_the_repl_banner_and_set_show_the_sampling_in_use(recommending: str) -> None:
    child = pexpect.spawn(sys.executable, ["-m", "llamactor.cli", "chat", "--model", recommending, "--n-ctx", "1024",
                                           "--n-threads", "1", "--top-k", "5"], encoding="utf-8", timeout=60,
                          dimensions=(40, 300))
    try:
        child.expect(r"Sampling: temperature 0\.2 \(chat\), top_k 5 \(operator\), top_p 0\.8 \(model\), "
                     r"min_p 0\.2 \(model\), repeat_penalty 1\.0,")
        child.expect(">>> ")
        child.sendline("/set temperature 0.7")
        child.expect(">>> ")
        child.sendline("/set")
        child.expect(r"temperature 0\.7 \(/set\)")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
