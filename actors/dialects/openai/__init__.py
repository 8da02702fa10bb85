"""The OpenAI dialect: ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings`` bodies
(``schema``, ``extras``, ``embeddings``), what they mean (``call``), their response bodies
(``replies``, ``logprobs``) and their streamed chunks (``events``)."""
