"""Pure: the lines of OpenAI's batch output and error files, and the File and Batch objects.

Output line: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}``.
A request that failed while running: the same with the error's status and ``{"error": ...}`` body,
in the error file. A line refused by validation: ``"response": null, "error": {"code", "message"}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def line_id(batch_id: str, line_no: int) -> str:
    """The ``id`` of one line's output entry; stable across resumes (it names the line, not the run)."""
    return f"batch_req_{batch_id.removeprefix('batch_')}_{line_no}"


def request_id(batch_id: str, line_no: int) -> str:
    """The llamactor request id a line runs under (logs, cancel)."""
    return f"{batch_id}-{line_no}"


def success_line(batch_id: str, line_no: int, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"id": line_id(batch_id, line_no), "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": request_id(batch_id, line_no), "body": body},
            "error": None}


def failed_request_line(batch_id: str, line_no: int, custom_id: str, status: int, message: str,
                        type_: str, code: str | None) -> dict[str, Any]:
    """A request the endpoint refused or that failed while running (what its HTTP call would answer)."""
    return {"id": line_id(batch_id, line_no), "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id(batch_id, line_no),
                         "body": {"error": {"message": message, "type": type_, "param": None, "code": code}}},
            "error": None}


def invalid_line(batch_id: str, line_no: int, custom_id: str | None, code: str, message: str) -> dict[str, Any]:
    """A line refused by validation before anything ran."""
    return {"id": line_id(batch_id, line_no), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message, "line": line_no + 1}}


def file_object(row: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's File object from a store row."""
    return {"id": row["id"], "object": "file", "bytes": row["bytes"], "created_at": row["created_at"],
            "filename": row["filename"], "purpose": row["purpose"], "status": "processed", "status_details": None}


def batch_usage(output_lines: Iterable[str]) -> dict[str, Any]:
    """The Batch object's ``usage``: the tokens of every successful line (chat and completions'
    ``prompt_tokens`` / ``completion_tokens``, Responses' ``input_tokens`` / ``output_tokens``)."""
    inputs = outputs = cached = 0
    for raw in output_lines:
        u = (json.loads(raw).get("response") or {}).get("body", {}).get("usage") or {}
        inputs += int(u.get("prompt_tokens", u.get("input_tokens", 0)) or 0)
        outputs += int(u.get("completion_tokens", u.get("output_tokens", 0)) or 0)
        details = u.get("prompt_tokens_details") or u.get("input_tokens_details") or {}
        cached += int(details.get("cached_tokens", 0) or 0)
    return {"input_tokens": inputs, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": outputs,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": inputs + outputs}
