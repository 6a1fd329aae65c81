"""ClawGymBench checker (stdlib only): runs the checks of its spec against the workspace (cwd).

Prints one JSON line of named sub-scores, then their mean as the last line (the ClawGym reward.sh rule).

The spec (expected answers, hidden test inputs) arrives on stdin, never as a file in the sandbox. The
checker runs the agent's own scripts, so it guards itself against them: it is not dumpable (a program it
runs cannot read its memory or reach its stdout through /proc/<pid>/fd), each program gets no stdin, a
scrubbed environment and its own session (killed when it ends), and in a ClawGym bubblewrap sandbox
every process other than the checker and its ancestors is killed before any score is printed (a `setsid`
daemon the program started included).
"""

import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import tempfile

PR_SET_DUMPABLE = 4


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def lines(text):
    return [ln.rstrip() for ln in text.strip("\n").splitlines()]


def num(text):
    try:
        return float(str(text).strip().replace(",", "").replace("$", ""))
    except ValueError:
        return None


def same(a, b, rel_tol=1e-6):
    x, y = num(a), num(b)
    if x is not None and y is not None:
        return math.isclose(x, y, rel_tol=rel_tol, abs_tol=1e-9)
    return str(a).strip().lower() == str(b).strip().lower()


def get(data, dotted):
    if isinstance(data, dict) and dotted in data:  # a key that itself contains dots ("a.txt")
        return data[dotted]
    for part in dotted.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def check(c):
    kind, path = c["kind"], c.get("path", "")
    if kind != "script_output" and not os.path.isfile(path):
        return 0.0
    if kind == "exists":
        return 1.0
    if kind == "file_equals":
        return float(lines(read(path)) == lines(c["expected"]))
    if kind == "first_line":
        got = lines(read(path))
        return float(bool(got) and got[0].strip() == c["expected"].strip())
    if kind == "file_contains":
        text = read(path).lower()
        return sum(item.lower() in text for item in c["items"]) / len(c["items"])
    if kind == "number":
        return float(same(read(path), c["expected"], c.get("rel_tol", 1e-6)))
    if kind == "csv_rows":
        got = [[cell.strip() for cell in ln.split(",")] for ln in lines(read(path)) if ln.strip()]
        want = c["rows"]
        return float(
            len(got) == len(want)
            and all(len(g) == len(w) and all(same(a, b) for a, b in zip(g, w)) for g, w in zip(got, want))
        )
    if kind == "json_values":
        try:
            data = json.loads(read(path))
        except ValueError:
            return 0.0
        ok = 0
        for key, want in c["values"].items():
            try:
                got = get(data, key)
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if isinstance(want, list):
                ok += isinstance(got, list) and len(got) == len(want) and all(same(a, b) for a, b in zip(got, want))
            else:
                ok += same(got, want)
        return ok / len(c["values"])
    if kind == "script_output":
        if not os.path.isfile(c["script"]):
            return 0.0
        passed = 0
        for case in c["cases"]:
            with tempfile.TemporaryDirectory() as tmp:
                args = []
                for arg in case["args"]:
                    if isinstance(arg, dict):  # {"file": name, "content": text}: a hidden input file
                        target = os.path.join(tmp, arg["file"])
                        with open(target, "w", encoding="utf-8") as f:
                            f.write(arg["content"])
                        args.append(target)
                    else:
                        args.append(str(arg))
                passed += run_program([sys.executable, c["script"], *args]) == lines(case["stdout"])
        return passed / len(c["cases"])
    raise ValueError("unknown check kind " + kind)


def run_program(argv):
    """The stdout lines of the agent's program, or None if it failed or ran past 10 s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}  # runs as `python3 script.py` would
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        out = None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its session; a `setsid` escapee is left to the sweep below
        except (ProcessLookupError, PermissionError):
            pass
        end_other_processes()
        proc.communicate()
    return lines(out) if out is not None and proc.returncode == 0 else None


def ancestors():
    pids, pid = set(), os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rpartition(")")[2].split()[1])
    return pids


def in_own_sandbox():
    """Whether this runs in a ClawGym bubblewrap sandbox (bwrap is PID 1), where every process but this
    checker and its ancestors is one the checked program left. Anywhere else (the host, a remote sandbox
    with its own agent) nothing is swept: those processes are not the program's."""
    try:
        with open("/proc/1/comm") as f:
            return f.read().strip() == "bwrap"
    except OSError:
        return False


def end_other_processes():
    """Kill everything but this checker and its ancestors (the sandbox's init): what a program left behind."""
    if not IN_OWN_SANDBOX:
        return
    keep = ancestors()
    for _ in range(100):
        others = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if pid not in keep and alive(pid)]
        if not others:
            return
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


IN_OWN_SANDBOX = in_own_sandbox()


def main():
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    spec = json.loads(sys.stdin.read())
    scores = {c["name"]: float(check(c)) for c in spec["checks"]}
    end_other_processes()
    print(json.dumps(scores))
    print(round(sum(scores.values()) / len(scores), 6))


if __name__ == "__main__":
    main()
