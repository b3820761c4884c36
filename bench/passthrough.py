"""The floor under ``serve_overhead_vs_direct``: a proxy on the same stack as `recap serve`
(Starlette under uvicorn, one pooled httpx client) that parses the request body, serializes it
again and streams the upstream's reply back, doing nothing else: no store, no assembly, no
authentication. ``python -m bench.passthrough UPSTREAM_BASE PORT [--lean]`` serves
``POST /v1/chat/completions`` on 127.0.0.1:PORT until stopped.

With ``--lean`` it is the fastest proxy of its kind the Python ecosystem offers here: the same
server (uvicorn with httptools and uvloop, Starlette), the body parsed and written by orjson and
sent by one pooled aiohttp session. It answers what any Python proxy in front of the model costs
at the least, whatever it stores or assembles."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


async def health(request: Request) -> Response:
    return Response("ok")


def _proxy_app(completions: Any, lifespan: Any) -> Starlette:
    """The proxy's routes: the completions handler and a health check."""
    return Starlette(
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


def create_app(upstream: str) -> Starlette:
    client: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        client["http"] = httpx.AsyncClient(base_url=upstream, timeout=120)
        try:
            yield
        finally:
            await client["http"].aclose()

    async def completions(request: Request) -> Response:
        body = json.loads(await request.body())
        body["model"] = str(body["model"]).split("/", 1)[-1]
        sent = client["http"].build_request(
            "POST", "/chat/completions", content=json.dumps(body).encode()
        )
        reply = await client["http"].send(sent, stream=True)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in reply.aiter_raw():
                    yield chunk
            finally:
                await reply.aclose()

        return StreamingResponse(
            chunks(), status_code=reply.status_code, media_type="text/event-stream"
        )

    return _proxy_app(completions, lifespan)


def create_lean_app(upstream: str) -> Starlette:
    import aiohttp
    import orjson

    session: dict[str, aiohttp.ClientSession] = {}
    url = f"{upstream}/chat/completions"
    headers = {"Content-Type": "application/json"}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=100)
        session["http"] = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        try:
            yield
        finally:
            await session["http"].close()

    async def completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        body["model"] = str(body["model"]).split("/", 1)[-1]
        reply = await session["http"].post(url, data=orjson.dumps(body), headers=headers)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in reply.content.iter_any():
                    yield chunk
            finally:
                reply.release()

        return StreamingResponse(chunks(), status_code=reply.status, media_type="text/event-stream")

    return _proxy_app(completions, lifespan)


def main(argv: list[str]) -> int:
    import uvicorn

    upstream, port = argv[0], int(argv[1])
    app = create_lean_app(upstream) if "--lean" in argv[2:] else create_app(upstream)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
