"""pairreg runner: a pure library that measures speculative-decoding pairs.

Model directories and prompts in, numbers out. It never touches the registry database;
a worker glues the two together.
"""

from runner.engine import DecodeOptions, PromptRun, SpeculativeEngine
from runner.measure import MeasurementResult, measure_pair, plain_greedy
from runner.mlflow_log import default_tracking_uri, log_measurement
from runner.overlap import greedy_continuations, teacher_forced_overlap
from runner.settings import MeasureSettings
from runner.stats import speedup_estimate, summarize, theoretical_tau
from runner.suites import CATEGORIES, Prompt, Suite, load_suite, suite_digest
from runner.version import RUNNER_VERSION

__all__ = [
    "CATEGORIES",
    "RUNNER_VERSION",
    "DecodeOptions",
    "MeasureSettings",
    "MeasurementResult",
    "Prompt",
    "PromptRun",
    "SpeculativeEngine",
    "Suite",
    "default_tracking_uri",
    "greedy_continuations",
    "load_suite",
    "log_measurement",
    "measure_pair",
    "plain_greedy",
    "speedup_estimate",
    "suite_digest",
    "summarize",
    "teacher_forced_overlap",
    "theoretical_tau",
]
