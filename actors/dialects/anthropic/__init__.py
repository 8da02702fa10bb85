"""Anthropic's Messages dialect: request bodies (``schema``), what they mean on the chat path
(``call``), the Message object (``message``) and the streamed events (``events``)."""
