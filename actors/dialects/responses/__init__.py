"""OpenAI's Responses dialect: request bodies (``schema``), what they mean on the chat path
(``plan``), the response object and its items (``output``), and the streamed events (``events``)."""
