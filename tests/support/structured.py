"""What the structured-output tests ask for and check, in-process (test_structured.py) and over HTTP
(test_http_structured.py)."""

from __future__ import annotations

import json

import pydantic


class Capital(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=24)
    country: str = pydantic.Field(max_length=24)


PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False,
}


def valid_person(text: str) -> bool:
    """``text`` is a JSON object that PERSON_SCHEMA accepts."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return False
    return (set(data) == {"name", "age", "tags"} and isinstance(data["name"], str) and len(data["name"]) <= 20
            and isinstance(data["age"], int) and 0 <= data["age"] <= 120
            and all(t in ("a", "b", "c") for t in data["tags"]) and len(data["tags"]) <= 3)
