"""``add_dashboard_routes``: the live dashboard on a FastAPI app.  FastAPI is imported here
only, so the rest of the package works without the ``serve`` extra."""

from __future__ import annotations

from ..errors import LightSpecError
from .feed import DashboardFeed
from .page import STATIC_TYPES, live_page, static_text


def add_dashboard_routes(app, feed: DashboardFeed, prefix: str = "/dashboard", interval_ms: int = 1000,
                         dependencies=None) -> None:
    """Mount on ``app`` (a ``fastapi.FastAPI``):

    * ``GET {prefix}``: the live page, polling ``{prefix}/data`` every ``interval_ms``;
    * ``GET {prefix}/data?since=N``: ``feed.snapshot(N)`` as JSON (400 with an OpenAI-style
      error body for a negative ``since``, 422 from FastAPI for a non-integer);
    * ``GET {prefix}/static/{name}``: the page's script, style, vendored libraries and
      their licences (404 for any other name).

    ``dependencies``: ``fastapi.Depends(...)`` objects for every route (e.g. the server's API-key check).
    Raises ``LightSpecError`` when FastAPI is not installed (``pip install lightspec-core[serve]``)."""
    try:
        from fastapi import APIRouter, Query
        from fastapi.responses import HTMLResponse, JSONResponse, Response
    except ImportError:
        raise LightSpecError("the dashboard needs FastAPI: pip install 'lightspec-core[serve]'") from None
    if not isinstance(feed, DashboardFeed):
        raise LightSpecError(f"feed={feed!r} is invalid: use a lightspec_core.dashboard.DashboardFeed")
    if not (isinstance(prefix, str) and prefix.startswith("/") and not prefix.endswith("/")):
        raise LightSpecError(f"prefix={prefix!r} is invalid: use a path such as '/dashboard' (leading '/', no trailing '/')")
    if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or interval_ms < 100:
        raise LightSpecError(f"interval_ms={interval_ms!r} is invalid: use an integer >= 100")

    page = live_page(prefix, interval_ms)
    assets = {name: static_text(name) for name in STATIC_TYPES}
    router = APIRouter(dependencies=list(dependencies or []))

    @router.get(prefix, response_class=HTMLResponse, include_in_schema=False)
    def dashboard_page():
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    @router.get(prefix + "/data")
    def dashboard_data(since: int = Query(0, description="cursor of the last snapshot; 0 for everything kept")):
        if since < 0:
            return JSONResponse(status_code=400, content={"error": {
                "message": f"since={since} is invalid: use an integer >= 0 (the cursor of the last snapshot)",
                "type": "invalid_request_error", "param": "since", "code": None}})
        return JSONResponse(feed.snapshot(since), headers={"Cache-Control": "no-store"})

    @router.get(prefix + "/static/{name}", include_in_schema=False)
    def dashboard_static(name: str):
        if name not in assets:
            return JSONResponse(status_code=404, content={"error": {
                "message": f"dashboard file {name!r} does not exist; files: {', '.join(sorted(assets))}",
                "type": "invalid_request_error", "param": "name", "code": None}})
        return Response(assets[name], media_type=STATIC_TYPES[name])

    app.include_router(router)
