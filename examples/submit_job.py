"""Submit a fine-tuning job to a SlideDP Workbench and follow it to the end (standard library only).

    python examples/submit_job.py                                   # the CPU demo preset, local workbench
    python examples/submit_job.py job.yaml --name my-run            # your job (YAML needs pyyaml, or use .json)
    python examples/submit_job.py job.json --url http://gpu-box:8000 --token "$SLIDEDP_API_TOKEN"

It POSTs the job, follows the live event stream (/api/jobs/{id}/events), prints one line per optimizer step
and the job's log lines with --logs, reconnects without losing events (Last-Event-ID) if the connection drops,
and exits 0 when the job completes (1 otherwise). Ctrl-C detaches: the job keeps running on the workbench.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, Optional


class Workbench:
    def __init__(self, url: str, token: Optional[str]):
        self.url, self.token = url.rstrip("/"), token

    def request(
        self, method: str, path: str, body: Any = None, headers: Optional[dict] = None, timeout: float = 30
    ) -> urllib.request.addinfourl:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        return urllib.request.urlopen(req, timeout=timeout)

    def json(self, method: str, path: str, body: Any = None) -> Any:
        try:
            with self.request(method, path, body) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as err:
            detail = json.loads(err.read() or b"{}").get("detail", err.reason)
            if err.code in (409, 422) and isinstance(detail, list):  # one line per field, by its config key path
                lines = [f"  {'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in detail]
                raise SystemExit("the job was refused:\n" + "\n".join(lines)) from None
            raise SystemExit(f"{method} {path}: HTTP {err.code}: {detail}") from None

    def events(self, job_id: int, last_id: int = 0) -> Iterator[tuple[int, str, dict]]:
        """(id, event, data) from the job's SSE stream, reconnecting after the last id seen until it ends."""
        while True:
            try:
                with self.request(
                    "GET", f"/api/jobs/{job_id}/events", headers={"Last-Event-ID": str(last_id)}, timeout=60
                ) as resp:
                    event: dict[str, str] = {}
                    for raw in resp:
                        line = raw.decode().rstrip("\r\n")
                        if not line:
                            if "data" in event:
                                last_id = int(event.get("id", last_id))
                                yield last_id, event.get("event", "message"), json.loads(event["data"])
                            event = {}
                        elif not line.startswith(":"):
                            key, _, value = line.partition(":")
                            event[key] = value[1:] if value.startswith(" ") else value
                return  # the server ends the stream after the job's final status
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                if isinstance(exc, urllib.error.HTTPError) and exc.code != 503:
                    raise
                print(f"(connection lost: {exc}; reconnecting)", file=sys.stderr)
                time.sleep(2)


def load_job(path: Optional[str], wb: Workbench) -> dict:
    if path is None:
        presets = {p["id"]: p for p in wb.json("GET", "/api/presets")["items"]}
        return dict(presets["cpu-demo"]["config"])
    with open(path, encoding="utf-8") as fh:
        if path.endswith(".json"):
            return json.load(fh)
        import yaml  # pip install pyyaml

        return yaml.safe_load(fh)


def step_line(m: dict, steps: int) -> str:
    return (
        f"step {m['step']:>5}/{steps}  loss {m['loss']:.4f}  lr {m['lr']:.2e}  gnorm {m['grad_norm']:.3f}  "
        f"{m['step_time_s']:.3f} s  {m['tokens_per_s']:,.0f} tok/s"
    )


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", help="job config (.yaml or .json); default: the CPU demo preset")
    parser.add_argument("--url", default=os.environ.get("SLIDEDP_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("SLIDEDP_API_TOKEN"))
    parser.add_argument("--name", help="a label for the job list")
    parser.add_argument("--logs", action="store_true", help="print the job's log lines too")
    args = parser.parse_args(argv)

    wb = Workbench(args.url, args.token)
    job = load_job(args.job, wb)
    if args.name:
        job["name"] = args.name
    created = wb.json("POST", "/api/jobs", job)
    job_id, steps = created["id"], created["steps"]
    print(f"job {job_id} queued; output in {created['output_dir']}; {args.url}/jobs/{job_id}")
    status = created["status"]
    try:
        for _, event, data in wb.events(job_id):
            if event == "metrics":
                print(step_line(data, steps), flush=True)
            elif event == "log" and args.logs:
                print(f"  | {data['line']}", flush=True)
            elif event == "status":
                status = data["status"]
                error = (data.get("error") or {}).get("message")
                print(f"job {job_id}: {status}" + (f" ({error})" if error else ""), flush=True)
    except KeyboardInterrupt:
        print(
            f"\ndetached; job {job_id} keeps running. Cancel it with: "
            f"curl -X POST {args.url}/api/jobs/{job_id}/cancel",
            file=sys.stderr,
        )
        return 130
    final = wb.json("GET", f"/api/jobs/{job_id}")
    if final["status"] == "completed":
        print(f"done: {final['step']} steps; export: {args.url}/api/jobs/{job_id}/export")
    return 0 if final["status"] == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
