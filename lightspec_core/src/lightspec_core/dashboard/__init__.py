"""The dashboard: live statistics on a FastAPI server (``DashboardFeed`` +
``add_dashboard_routes``) and the same charts as one self-contained page for a run's
``--stats-out`` file (``write_report``, ``lightspec report``)."""

from .feed import DashboardFeed
from .page import report_page, write_report
from .records import compact, read_stats
from .routes import add_dashboard_routes

__all__ = ["DashboardFeed", "add_dashboard_routes", "write_report", "report_page", "read_stats", "compact"]
