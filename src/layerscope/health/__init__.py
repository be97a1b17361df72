"""Health rules: which layer went wrong, and when.

Rules run on the writer thread on each flush's finalised rows (the sentinel's and the
attention table's too), never in the hot path. Each has thresholds and hysteresis, so one
episode gives one alert: a row of the ``alerts`` table and one log line on the training side
(logger ``layerscope``).
"""

from layerscope.health._accumulating_grad import CARRIED_SCALAR, accumulation_probe
from layerscope.health._alert import SEVERITIES, Alert
from layerscope.health._config import RULES, AlertsConfig, parse_alerts
from layerscope.health._dead_units import dead_units
from layerscope.health._eval_mode import EVAL_MODE_SCALAR
from layerscope.health._monitor import HealthMonitor
from layerscope.health._parameter_sets import left_out_of
from layerscope.health._wrong_loss import WRONG_LOSS_SCALAR, WRONG_LOSSES

__all__ = [
    "CARRIED_SCALAR",
    "EVAL_MODE_SCALAR",
    "RULES",
    "SEVERITIES",
    "WRONG_LOSSES",
    "WRONG_LOSS_SCALAR",
    "Alert",
    "AlertsConfig",
    "HealthMonitor",
    "accumulation_probe",
    "dead_units",
    "left_out_of",
    "parse_alerts",
]
