"""The vocabulary every layer shares: typed errors, ``Config`` and ``SamplingParams``, priorities,
results, grammars and tools, the typed requests and the frozen messages between callers and
actors, chat formats, tenants, logging setup.

Pure in the sense the layer list means: no actor framework (pykka), no llama.cpp, no web
framework and no thread of its own -- values, their checks and functions over them, runnable on
any thread (``tests/test_layers.py`` checks the imports). Only ``private_files`` (data files made
private) and ``logging`` (its setup) touch the process, when a layer above calls them.
"""
