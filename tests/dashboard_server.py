"""Test helpers for the dashboard: a FastAPI app with the dashboard's routes served by
uvicorn on a free loopback port (in a thread), and a pipeline on the tiny model that
feeds a ``DashboardFeed``."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request


def need_server_stack() -> None:
    """Skip the calling test when FastAPI or uvicorn is missing (the ``serve`` extra), except
    in CI (CI=true), where scripts/dev.sh installs them and their absence is a failure."""
    import importlib.util
    import os

    import pytest

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        reason = f"needs {', '.join(missing)}: pip install 'lightspec-core[serve]' (scripts/dev.sh setup does)"
        if os.environ.get("CI") == "true":
            pytest.fail("CI: " + reason)
        pytest.skip(reason)


@contextlib.contextmanager
def serve_dashboard(feed, **route_options):
    """Yield the base URL (``http://127.0.0.1:PORT``) of a FastAPI app with
    ``add_dashboard_routes(app, feed, **route_options)``, served until the block ends."""
    need_server_stack()
    import uvicorn
    from fastapi import FastAPI
    from lightspec_core.dashboard import add_dashboard_routes

    app = FastAPI()
    add_dashboard_routes(app, feed, **route_options)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # a free port, held from here on: no race with other processes
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def get(url: str) -> tuple[int, str, bytes]:
    """``(status, content type, body)`` of a GET, errors included."""
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


def get_json(url: str) -> tuple[int, dict]:
    status, _, body = get(url)
    return status, json.loads(body)


def tiny_pipeline(feed, k: int = 3):
    """A pipeline on the tiny test model that drafts with itself (so drafts are accepted)
    under a static budget of ``k``, with ``feed`` among its sinks."""
    from helpers import cached_tiny

    from lightspec_core import MTPPipeline

    model, tok = cached_tiny()
    return MTPPipeline(model, tok, strategy="draft_model", draft_model=model, budget={"type": "static", "k": k},
                       sinks=[feed])
