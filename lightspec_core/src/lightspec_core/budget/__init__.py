"""Budget policies: how many tokens each row drafts at each step.

Built-in policies (registered in ``builtins.py``; each implements ``lightspec_budget(ctx)
-> Budget`` and learns from ``lightspec_on_stats(event)``):

* ``static`` (``StaticBudget``): always k tokens;
* ``dynamic`` (``DynamicBudget``, the default): the cost-aware draft length;
* ``feedback`` (``FeedbackBudget``): B_{t+1} = alpha B_t + beta T_actual / T_target.

Modules, one job each: ``acceptance`` (acceptance and hit-rate estimates), ``gate`` (the
per-row confidence threshold), ``costs`` (verify, draft, catch-up and overhead costs),
``guard`` (the throughput guard and the end-of-generation check), ``windows`` (median
windows), ``tensors`` (the reused result tensors), and one module per policy.  The
measurements behind the rules: ``docs/design/budget.md``.
"""

from .costs import SETUP_HORIZON
from .dynamic import BATCH_CALIBRATION, MAX_RECHECK, PLAIN_REFRESH, RECHECK, DynamicBudget
from .feedback import FeedbackBudget
from .static import StaticBudget
from .windows import ForwardWindow, MedianWindow

__all__ = [
    "BATCH_CALIBRATION",
    "MAX_RECHECK",
    "PLAIN_REFRESH",
    "RECHECK",
    "SETUP_HORIZON",
    "DynamicBudget",
    "FeedbackBudget",
    "ForwardWindow",
    "MedianWindow",
    "StaticBudget",
]
