"""ClawGymBench checker (stdlib only): runs the checks in reward/spec.json against the workspace (cwd).

Prints one JSON line of named sub-scores, then their mean as the last line (the ClawGym reward.sh rule).
"""

import json
import math
import os
import subprocess
import sys
import tempfile


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
                try:
                    run = subprocess.run(
                        [sys.executable, c["script"], *args], capture_output=True, text=True, timeout=10
                    )
                except subprocess.TimeoutExpired:
                    continue
                passed += run.returncode == 0 and lines(run.stdout) == lines(case["stdout"])
        return passed / len(c["cases"])
    raise ValueError("unknown check kind " + kind)


def main():
    spec = json.loads(read(os.path.join("reward", "spec.json")))
    scores = {c["name"]: float(check(c)) for c in spec["checks"]}
    print(json.dumps(scores))
    print(round(sum(scores.values()) / len(scores), 6))


if __name__ == "__main__":
    main()
