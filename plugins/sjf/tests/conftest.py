"""Run the plugin's tests from a checkout without installing it: its src/ goes on the path."""

import sys
from pathlib import Path

try:
    import paged_bench_sjf  # noqa: F401  (installed)
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
