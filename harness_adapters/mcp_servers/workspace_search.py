"""A stdio MCP server that searches the task's documents: `search_workspace` and `read_document`.

Run by a harness inside the sandbox (`python workspace_search.py [--root DIR]`; the root defaults to the
working directory, i.e. the task's workspace). Plain text files are searched line by line, case-insensitive.
Standalone on purpose (only the `mcp` package): the harness launches it as a separate process.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer

MAX_FILE_BYTES = 2_000_000
SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv"}

server = MCPServer("workspace_search", instructions="Search and read the documents of the task's workspace.")
ROOT = Path.cwd()


def _files(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_file() and path.stat().st_size <= MAX_FILE_BYTES:
                found.append(path)
    return found


@server.tool()
def search_workspace(query: str, max_results: int = 20) -> str:
    """Find lines containing `query` (case-insensitive) in the workspace's text files; returns `path:line: text`."""
    needle = query.lower()
    hits: list[str] = []
    for path in _files(ROOT):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(lines, 1):
            if needle in line.lower():
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:200]}")
                if len(hits) >= max_results:
                    return "\n".join(hits)
    return "\n".join(hits) if hits else f"no match for {query!r}"


@server.tool()
def read_document(path: str) -> str:
    """The text of one workspace file (a path relative to the workspace)."""
    target = (ROOT / path).resolve()
    if ROOT.resolve() not in (target, *target.parents):
        return f"error: {path!r} is outside the workspace"
    try:
        return target.read_text(encoding="utf-8")[:100_000]
    except (OSError, UnicodeDecodeError) as exc:
        return f"error: cannot read {path!r}: {exc}"


def main() -> None:
    global ROOT
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default=None, help="folder to search (default: the working directory)")
    args = parser.parse_args()
    ROOT = Path(args.root).resolve() if args.root else Path.cwd()
    server.run("stdio")


if __name__ == "__main__":
    main()
