"""What the tests share: helpers, the test data and the chat templates (``DATA``, ``TEMPLATES``)."""

from pathlib import Path

DATA = Path(__file__).parent / "data"
TEMPLATES = Path(__file__).parent / "templates"
