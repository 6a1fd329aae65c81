"""The fork server of `verifiers.isolated`: `python -m verifiers.isolated_worker CONTROL_FD` (started by it)."""

import sys

from verifiers.isolated import serve

if __name__ == "__main__":
    serve(int(sys.argv[1]))
