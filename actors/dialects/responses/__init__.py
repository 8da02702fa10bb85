"""OpenAI's Responses dialect: request bodies (``schema``), what they mean on the chat path
(``call``), the response object and its output items (``output_items``), and the streamed events (``events``)."""
