"""API keys for the OpenAI API: `Authorization: Bearer KEY` on every /v1 path, as vLLM's `--api-key` does.

Health (/health) and the API docs stay open, so that probes and load balancers need no key; Triton's own ports
and `trtspec serve`'s health port are not behind it either (keep them inside the cluster or the host).
"""

from __future__ import annotations

import hmac
from typing import Any, Awaitable, Callable, Iterable

from starlette.responses import JSONResponse

from trtspec.openai.protocol import OpenAIError

#: the environment variable `trtspec serve` reads its keys from (as vLLM's VLLM_API_KEY); the Kubernetes
#: manifests set it from a Secret
API_KEY_ENV = "TRTSPEC_API_KEY"
PROTECTED_PREFIX = "/v1"

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def _bearer(scope: Scope) -> bytes | None:
    """The bearer token as sent (bytes: a key is compared byte for byte, whatever its characters)."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


def _unauthorized(token: bytes | None) -> JSONResponse:
    """OpenAI's own answer to a missing or wrong key: 401, code invalid_api_key."""
    if token is None:
        message = ("You didn't provide an API key. You need to provide your API key in an Authorization header "
                   "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
    else:
        message = "Incorrect API key provided."  # the key is not echoed: it may be another service's secret
    error = OpenAIError(401, message, code="invalid_api_key")
    return JSONResponse(error.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})


class RequireAPIKey:
    """ASGI middleware: a request to a /v1 path without one of `keys` as its bearer token gets a 401.
    Plain ASGI (not Starlette's BaseHTTPMiddleware), so server-sent event streams pass through untouched."""

    def __init__(self, app: ASGIApp, keys: Iterable[str]) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys if k]
        if not self.keys:
            raise ValueError("RequireAPIKey needs at least one non-empty key")

    def _allowed(self, token: bytes | None) -> bool:
        # compare_digest against every key: the time taken says nothing about which key nearly matched
        return token is not None and sum(hmac.compare_digest(token, k) for k in self.keys) > 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if (scope["type"] != "http" or scope.get("method") == "OPTIONS"
                or not scope["path"].startswith(PROTECTED_PREFIX)):
            await self.app(scope, receive, send)
            return
        token = _bearer(scope)
        if self._allowed(token):
            await self.app(scope, receive, send)
        else:
            await _unauthorized(token)(scope, receive, send)


def require_api_key(app: Any, keys: Iterable[str]) -> None:
    """Protect `app`'s /v1 paths with `keys` (nothing to do when there are none)."""
    keys = [k for k in keys if k]
    if keys:
        app.add_middleware(RequireAPIKey, keys=keys)
