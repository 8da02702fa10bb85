"""The official openai client against `llamactor serve` (start it first: `.venv/bin/llamactor serve`)."""

import openai

client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused-unless---api-key")
model = client.models.list().data[0].id

reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=32)
print(reply.choices[0].message.content)

for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count to five."}],
                                            max_tokens=32, stream=True):
    if chunk.choices:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
