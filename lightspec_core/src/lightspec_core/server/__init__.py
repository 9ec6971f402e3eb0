"""LightSpec's OpenAI-compatible server (needs the ``serve`` extra: fastapi, uvicorn,
prometheus_client).

    serve(pipe, port=8080, batch_size=32)          # blocks (``lightspec serve``)
    handle = start_server(pipe, port=0)            # in a background thread; handle.url, handle.stop()
"""

from __future__ import annotations

import socket
import threading
import time

from ..errors import LightSpecError
from .app import ServerConfig, build_app

__all__ = ["ServerConfig", "ServerHandle", "build_app", "serve", "start_server"]


def _check(port, batch_size, max_queue, host) -> None:
    for name, value, low in (("port", port, 0), ("batch_size", batch_size, 1), ("max_queue", max_queue, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (name == "port" and value > 65535):
            top = "65535" if name == "port" else "inf"
            raise LightSpecError(f"{name}={value!r} is invalid: use an integer in [{low}, {top}]")
    if not isinstance(host, str) or not host:
        raise LightSpecError(f"host={host!r} is invalid: use an address such as 127.0.0.1")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise LightSpecError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    return sock


class ServerHandle:
    """A server running in a background thread: ``url`` (``http://host:port``), ``app``, ``stop()``."""

    def __init__(self, app, sock: socket.socket, log_level: str = "warning"):
        import uvicorn

        self.app, self.sock = app, sock
        host, port = sock.getsockname()[:2]
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, name="lightspec-http",
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise LightSpecError("the server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def start_server(pipe, port: int = 0, batch_size: int = 32, host: str = "127.0.0.1", api_key: str | None = None,
                 max_queue: int = 256, log_level: str = "warning", **options) -> ServerHandle:
    """Serve ``pipe`` in a background thread (``port=0``: a free port); returns its handle."""
    _check(port, batch_size, max_queue, host)
    app = build_app(pipe, ServerConfig(batch_size=batch_size, max_queue=max_queue, api_key=api_key, **options))
    return ServerHandle(app, _bind(host, port), log_level)


def serve(pipe, port: int = 8080, batch_size: int = 32, host: str = "127.0.0.1", api_key: str | None = None,
          max_queue: int = 256, log_level: str = "info", **options) -> None:
    """Serve ``pipe`` until interrupted (Ctrl-C)."""
    import uvicorn

    _check(port, batch_size, max_queue, host)
    app = build_app(pipe, ServerConfig(batch_size=batch_size, max_queue=max_queue, api_key=api_key, **options))
    sock = _bind(host, port)
    try:
        uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5)).run(sockets=[sock])
    finally:
        sock.close()
