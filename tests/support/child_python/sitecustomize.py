"""Run by every Python process the tests start (this folder is on their ``PYTHONPATH``): it
guards their model loads as the pytest process guards its own (see ``model_load_guard``)."""

import os

if os.environ.get("LLAMACTOR_TEST_MODEL_LOADS"):
    import model_load_guard

    model_load_guard.install()
