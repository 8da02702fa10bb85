"""llamactor.cli: the ``llamactor`` command (``chat``, ``ask``, ``info``, ``serve``, ``bench``)."""
