"""Anthropic's Messages dialect: request bodies (``schema``), what they mean on the chat path
(``plan``), the Message object (``message``) and the streamed events (``events``)."""
