"""Rerank and score: the bodies Cohere (v1, v2), Jina, llama-server / TEI, vLLM and Ollama clients
send, the one rerank each makes (``call``: ``Client.submit_rerank``'s arguments, every 400 decided
before a model is touched) and the answers in each client's shape (``replies``) (pure).
"""
