import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "verifiers"))  # importlib mode: make host_sandbox_double importable
