"""``python -m llamactor.cli``: the ``llamactor`` command."""

from llamactor.cli.commands import main

main()
