"""Every failure as OpenAI's error body, {"error": {"message", "type", "param", "code"}}.

The official clients turn that body into their usual exceptions (BadRequestError, NotFoundError,
...), so a refused request reads the same from nano_infer as from OpenAI or vLLM. A field pydantic
refuses (body.py), Starlette's own failures (an unknown path) and crashes are rewritten into it
too; a crash shows the client only an id to look up in the server log.
"""
from __future__ import annotations

import logging
import uuid

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ..async_engine.fair_queue import TenantBacklogFull

log = logging.getLogger("nano_infer.api_server")


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}  # e.g. a 429's Retry-After

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.body()}, status_code=self.status, headers=self.headers)

    def body(self) -> dict:
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


async def _api_error(request, exc: APIError):
    return exc.response()


async def _backlog_full(request, exc: TenantBacklogFull):
    """A tenant's queue for the server's workers (parsing, tokenizing, rendering) is full, wherever it was met."""
    return APIError(429, str(exc), "rate_limit_error", headers={"Retry-After": "1"}).response()


def check_model(requested: str | None, served: str) -> None:
    """A body's `model`, if it names one, must be the served model's name (404 otherwise, as OpenAI answers)."""
    if requested is not None and requested != served:
        raise APIError(404, f"The model `{requested}` does not exist. This server serves `{served}`.",
                       param="model", code="model_not_found")


def invalid_field(err: dict) -> APIError:
    """The 400 for one of pydantic's errors, naming the field (its `loc` starts inside the body)."""
    loc = [str(x) for x in err["loc"]]
    if not loc:
        return APIError(400, f"the request body must be a JSON object ({err['msg']})")
    if err["type"] == "extra_forbidden":
        return APIError(400, f"unrecognized request argument: {'.'.join(loc)} (this server does not implement it)",
                        param=loc[0])
    return APIError(400, f"{'.'.join(loc)}: {err['msg']}", param=loc[0])



async def _http(request, exc: HTTPException):
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return APIError(exc.status_code, str(exc.detail), kind).response()


async def _hung_up(request, exc: ClientDisconnect):
    """The client closed the connection before its whole body arrived: nothing failed here, so it is a log
    line and a count, not an internal error (nginx's 499, "client closed request"; nobody reads the reply)."""
    log.info("client hung up before sending its whole body: %s %s", request.method, request.url.path)
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:  # nano_infer_client_hangups_total on /metrics
        metrics.client_hangups += 1
    return APIError(499, "the client closed the request", "client_closed_request").response()


async def _crash(request, exc: Exception):
    error_id = uuid.uuid4().hex[:12]
    log.error("internal error %s on %s %s", error_id, request.method, request.url.path, exc_info=exc)
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:  # nano_infer_server_internal_errors_total on /metrics
        metrics.internal_errors += 1
    return APIError(500, f"internal server error (id {error_id}, in the server log)", "internal_server_error").response()


# FastAPI(exception_handlers=...): these replace FastAPI's own handlers for the same exceptions.
EXCEPTION_HANDLERS = {APIError: _api_error, TenantBacklogFull: _backlog_full, HTTPException: _http, ClientDisconnect: _hung_up, Exception: _crash}
