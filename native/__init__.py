"""llamactor.native: the only code that imports llama_cpp or torch."""
