"""Pure: the lines of OpenAI's batch output and error files, the File and Batch objects, and
how long files live (OpenAI's ``expires_after`` policies).

Output line: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}``.
A request that failed while running: the same with the error's status and ``{"error": ...}`` body,
in the error file. A line refused by validation: ``"response": null, "error": {"code", "message"}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from llamactor.base.errors import InvalidRequestError

# OpenAI's bounds for ``expires_after`` / ``output_expires_after`` seconds (1 hour to 30 days), and
# the default of every file given no policy: batch input and output files alike, so that the data
# directory holds at most a month of files whatever its callers forget to delete.
MIN_EXPIRY_S = 3600
MAX_EXPIRY_S = 30 * 24 * 3600
FILE_TTL_S = MAX_EXPIRY_S


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
            "expires_at": row.get("expires_at"), "filename": row["filename"], "purpose": row["purpose"],
            "status": "processed", "status_details": None}


def expiry_seconds(policy: dict[str, Any] | None, what: str, default: int = FILE_TTL_S) -> int:
    """The seconds after its creation a file expires, from OpenAI's ``{"anchor": "created_at",
    "seconds": N}`` (``what`` names the field in errors; a multipart form gives N as text)."""
    if policy is None:
        return default
    if not isinstance(policy, dict) or set(policy) - {"anchor", "seconds"}:
        raise InvalidRequestError(f"{what} must be an object with anchor and seconds")
    if policy.get("anchor") != "created_at":
        raise InvalidRequestError(f"{what}[anchor] must be 'created_at' (got {policy.get('anchor')!r})")
    seconds = policy.get("seconds")
    if isinstance(seconds, str) and seconds.strip().isdigit():
        seconds = int(seconds)
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not MIN_EXPIRY_S <= seconds <= MAX_EXPIRY_S:
        raise InvalidRequestError(f"{what}[seconds] must be an integer from {MIN_EXPIRY_S} to {MAX_EXPIRY_S} "
                                  f"(got {policy.get('seconds')!r})")
    return seconds


def batch_object(batch_id: str, input_file_id: str, endpoint: str, completion_window: str, now: int,
                 metadata: dict[str, str] | None, output_expires_after: dict[str, Any] | None) -> dict[str, Any]:
    """A new Batch object, validating. ``expires_at`` is the end of its completion window (24 h);
    ``output_expires_after`` is kept as asked, for its output and error files."""
    return {"id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None, "input_file_id": input_file_id,
            "completion_window": completion_window, "status": "validating", "output_file_id": None,
            "error_file_id": None, "created_at": now, "in_progress_at": None, "expires_at": now + 24 * 3600,
            "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
            "cancelling_at": None, "cancelled_at": None, "metadata": metadata,
            **({"output_expires_after": output_expires_after} if output_expires_after else {})}


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
