"""The actor tree of one model: the supervisor, the batcher that owns the llama.cpp context, and
what runs on the batcher's thread (the step's parts, request state, prompt preparation, the
prefix cache's tiers below the KV cells). ``llamactor.handles.llm.start_tree`` starts one."""
