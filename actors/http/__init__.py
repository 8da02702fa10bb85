"""llamactor.http: the OpenAI-compatible daemon (``llamactor serve``) over the in-process API."""
