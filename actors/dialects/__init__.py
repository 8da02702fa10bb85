"""llamactor.dialects: what each HTTP dialect means, as pure translation (no web framework, no I/O).

Per dialect -- OpenAI chat / completions / embeddings, Responses, Anthropic Messages, Ollama, the
tokenizer and template endpoints -- its request schema (pydantic), its ``call`` module
(``chat_call(body, context)`` -> ``ChatCall`` ...): the typed requests the body makes
(``llamactor.base.request``) and what its answer needs, ``reply``: the
response body of the finished results, and ``events``: its event sequence over the merged pieces
of a stream (``llamactor.base.completion.ChoiceUpdate``), with the error event a failure after
the first byte becomes. The routes (``llamactor.http``) and batch lines (``llamactor.jobs``) both
build the same calls and replies, which render an answer as the batcher split it
(``llamactor.base.answer``: ``Piece.parts``, ``Completion.answer``).
"""
