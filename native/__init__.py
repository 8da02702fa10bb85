"""llamactor.native: the engine, the only library code that imports llama_cpp or torch (the
benchmark's yardsticks aside); only the batcher's side loads it."""
