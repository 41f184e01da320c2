"""Errors of the HTTP API in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with its status."""

from __future__ import annotations

from aiohttp import web


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def response(self) -> web.Response:
        return web.json_response({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                            "code": self.code}}, status=self.status)


def invalid(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


def not_found(what: str, item_id: str) -> ApiError:
    return ApiError(404, f"No {what} found with id '{item_id}'.", None, "not_found")
