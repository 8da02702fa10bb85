"""The Ollama dialect: request bodies and options (``schema``), what a chat or generate body means
(``call``), its answers whole and streamed (``replies``), embeddings (``embed``) and what the
model routes say of the models (``models``)."""
