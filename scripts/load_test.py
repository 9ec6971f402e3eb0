#!/usr/bin/env python
"""Load and fault test of ``lightspec serve`` (loopback only; stops by itself).

(One script over 400 lines on purpose: the server child, the fault round, the throughput round
and the report share one set of request builders and checks, and a user runs it as one file.)

    .venv/bin/python scripts/load_test.py                      # 200 requests, the zoo model, + transformers serve
    .venv/bin/python scripts/load_test.py --requests 20 --model DIR --strategy ngram --no-hf --json out.json

1. A LightSpec server runs in a child process (the model, ``--strategy`` by default, and a
   strategy ``flaky`` registered in that process whose drafter raises on every third
   ``propose``).  After a warm-up round its RSS is the warm baseline.
2. The fault round: ``--requests`` at once, mixed: plain and streaming completions with
   strategies ``--strategy``, ``ngram``, ``none`` and ``flaky``; malformed bodies (each
   must get its 4xx status and an OpenAI-style error); streams closed after their first
   chunk.  Every valid request must finish with exactly the text of the offline greedy
   generation of its prompt (computed here first, with ``MTPPipeline``).
3. The server must then be idle (no running or waiting request) and its RSS within 10% of
   the warm baseline.
4. Throughput: the same number of plain greedy requests at once, speculation on
   (``--strategy``) and off (``none``), and, unless ``--no-hf``, against ``transformers
   serve`` on the same model folder: requests/s and p50/p99 latency (``transformers serve
   --device cpu`` needs ``accelerate`` installed; without it that row reports its error).

Exit status 0 when every check passed, 1 otherwise; ``--json`` writes the measurements.
(Over 400 lines: one self-contained script, including the server child it starts, so that
it runs as a file with nothing else to install or import from the tests.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MALFORMED = [  # (body, expected status)
    (b"{not json", 400),
    (json.dumps({"prompt": "x"}).encode(), 422),
    (json.dumps({"model": "MODEL", "prompt": "x", "max_tokens": -5}).encode(), 422),
    (json.dumps({"model": "nope", "prompt": "x"}).encode(), 404),
    (json.dumps({"model": "MODEL", "prompt": "x", "temperature": "hot"}).encode(), 422),
    (json.dumps({"model": "MODEL", "prompt": "x", "strategy": "warp"}).encode(), 422),
    (b'{"model": "MODEL", "prompt": "' + b"y" * (1 << 21) + b'"}', 413),
]


# -- the server child ---------------------------------------------------------------------


def serve_child(args) -> None:
    """Run in the child process: register ``flaky`` and serve until terminated."""
    import torch
    from lightspec_core.plugins import get_registry

    from lightspec_core import DraftProposal, MTPPipeline, hookimpl

    torch.set_num_threads(args.threads)

    class Flaky:
        """Drafts what followed the newest token's last earlier occurrence; raises on every third call."""

        name = "flaky"

        def __init__(self):
            self.calls = 0

        def draft_cost_hints(self):
            return {self.name: 0.0}  # a lookup: no model forward, so the budget lets it draft

        @hookimpl
        def lightspec_propose(self, ctx):
            self.calls += 1
            if self.calls % 3 == 0:
                raise RuntimeError(f"flaky drafter: injected failure at call {self.calls}")
            drafts = []
            for b, seq in enumerate(ctx.sequences):
                k, draft = int(ctx.max_draft_list[b]), []
                for i in range(len(seq) - 2, -1, -1):
                    if k > 0 and seq[i] == seq[-1]:
                        draft = list(seq[i + 1 : i + 1 + k])
                        break
                drafts.append(draft)
            width = max(map(len, drafts))
            if width == 0:
                return None
            tokens = torch.tensor([d + [0] * (width - len(d)) for d in drafts], device=ctx.device)
            return DraftProposal(tokens=tokens, lengths=torch.tensor([len(d) for d in drafts], device=ctx.device),
                                 source=self.name)

    class FaultPlugin:
        @hookimpl
        def lightspec_register_strategies(self, register):
            register("flaky", Flaky, description="raises on every third propose (load test)")

    get_registry().add_plugin(FaultPlugin(), name="load_test_faults", distribution="load-test")
    pipe = MTPPipeline.from_pretrained(args.model, strategy=args.strategy, draft_model=args.draft_model)
    # a fixed budget for flaky: it drafts (and fails) whatever its acceptance
    pipe.serve(port=args.port, batch_size=args.batch_size, max_queue=4 * args.requests, model_name="m",
               log_level="warning", strategy_options={"flaky": {"budget": "static:k=3"}})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], url: str, timeout: float = 600, env: dict | None = None) -> subprocess.Popen:
    import httpx

    # the server's log goes to a file: a full pipe nobody reads would block its worker
    log = tempfile.NamedTemporaryFile("w+", prefix="load_test_server_", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env)
    proc.log_path = log.name
    end = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            raise SystemExit(f"server {cmd[:4]} did not start: {Path(log.name).read_text()[-2000:]}")
        time.sleep(0.3)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- the client ---------------------------------------------------------------------------


@dataclass
class Spec:
    kind: str  # plain | stream | disconnect | malformed
    prompt: int = 0
    strategy: str | None = None
    body: bytes = b""
    expect: int = 200


@dataclass
class Result:
    spec: Spec
    status: int = 0
    text: str = ""
    error: str | None = None
    latency: float = 0.0
    extra: dict = field(default_factory=dict)


def fault_round(n: int, prompts: int, strategies: list[str], rng: random.Random) -> list[Spec]:
    """``n`` requests in a shuffled order: 10% malformed, 10% streams closed after their first
    chunk, 15% on ``flaky``, the rest on ``strategies``; valid ones half plain, half streaming."""
    specs = []
    for i in range(n):
        slot = i % 20
        if slot < 2:
            body, status = MALFORMED[(i // 20 * 2 + slot) % len(MALFORMED)]
            specs.append(Spec("malformed", body=body.replace(b"MODEL", b"m"), expect=status))
        elif slot < 4:
            specs.append(Spec("disconnect", rng.randrange(prompts), rng.choice(strategies)))
        else:
            strategy = "flaky" if slot < 7 else strategies[i % len(strategies)]
            specs.append(Spec("stream" if i % 2 else "plain", rng.randrange(prompts), strategy))
    rng.shuffle(specs)
    return specs


async def send(client, url: str, spec: Spec, prompts: list[str], max_tokens: int, model: str) -> Result:
    res = Result(spec)
    t0 = time.perf_counter()
    try:
        if spec.kind == "malformed":
            r = await client.post(url + "/v1/completions", content=spec.body,
                                  headers={"content-type": "application/json"})
            res.status, body = r.status_code, r.json()
            err = body.get("error", {})
            if set(err) != {"message", "type", "param", "code"}:
                res.error = f"error body is not OpenAI-style: {body}"
            return res
        body = {"model": model, "prompt": prompts[spec.prompt], "max_tokens": max_tokens, "temperature": 0}
        if spec.strategy is not None:
            body["strategy"] = spec.strategy
        if spec.kind == "plain":
            r = await client.post(url + "/v1/completions", json=body)
            res.status = r.status_code
            data = r.json()
            if r.status_code == 200:
                res.text = data["choices"][0]["text"]
                res.extra = data.get("usage", {})
            else:
                res.error = str(data)
        else:
            body["stream"] = True
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                res.status = r.status_code
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        break
                    data = json.loads(line[6:])
                    if "error" in data:
                        res.error = str(data["error"])
                        break
                    res.text += data["choices"][0]["text"]
                    if spec.kind == "disconnect":
                        break  # leaving the block closes the connection mid-stream
    except Exception as exc:  # noqa: BLE001 - a transport failure is a result to report
        res.error = f"{type(exc).__name__}: {exc}"
    res.latency = time.perf_counter() - t0
    return res


async def run_round(url: str, specs: list[Spec], prompts: list[str], max_tokens: int, model: str, label: str = ""):
    import httpx
    from tqdm import tqdm

    limits = httpx.Limits(max_connections=len(specs) + 8, max_keepalive_connections=len(specs) + 8)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(1800.0)) as client:
        with tqdm(total=len(specs), desc=label or "requests", unit="req", file=sys.stderr, leave=False) as bar:

            async def one(spec):
                res = await send(client, url, spec, prompts, max_tokens, model)
                bar.update()
                return res

            t0 = time.perf_counter()
            results = await asyncio.gather(*(one(s) for s in specs))
            return results, time.perf_counter() - t0


def summary(results: list[Result], wall: float) -> dict:
    lat = sorted(r.latency for r in results if r.status == 200 and r.error is None)
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) >= 2 else lat * 99
    return {"requests": len(results), "ok": len(lat), "wall_s": round(wall, 3),
            "requests_per_s": round(len(lat) / wall, 3), "p50_s": round(q[49], 3), "p99_s": round(q[98], 3)}


# -- the run ------------------------------------------------------------------------------


def references(args, prompts: list[str]) -> list[str]:
    """Offline greedy text of every prompt (plain decoding: greedy output is the target's own)."""
    from lightspec_core import MTPPipeline

    pipe = MTPPipeline.from_pretrained(args.model, strategy="none")
    return [r.text for r in pipe.generate(prompts, max_new_tokens=args.max_tokens)]


def rss(pid: int) -> int:
    import psutil

    return psutil.Process(pid).memory_info().rss


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model folder (default: the zoo target)")
    ap.add_argument("--draft-model", default=None, help="draft model folder (default: the zoo draft with the zoo target)")
    ap.add_argument("--strategy", default="hybrid", help="the server's default strategy (speculation on)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each server")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers serve")
    ap.add_argument("--json", default=None, help="write the measurements here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline-s", type=int, default=3600, help="give up (and stop the servers) after this long")
    ap.add_argument("--serve-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.model is None:
        import lightspec_zoo

        args.model = str(lightspec_zoo.model_path(lightspec_zoo.DEFAULT_TARGET))
        if args.draft_model is None:
            args.draft_model = str(lightspec_zoo.model_path(lightspec_zoo.DEFAULT_DRAFT))
    if args.serve_child:
        serve_child(args)
        return 0
    signal.signal(signal.SIGALRM, _deadline)
    signal.alarm(args.deadline_s)
    prompts = load_prompts()
    rng = random.Random(args.seed)
    print(f"offline greedy references for {len(prompts)} prompts ...", file=sys.stderr)
    want = references(args, prompts)
    failures: list[str] = []
    report: dict = {"model": args.model, "strategy": args.strategy, "requests": args.requests,
                    "max_tokens": args.max_tokens, "batch_size": args.batch_size, "threads": args.threads}

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-child", "--port", str(port), "--model", args.model,
           "--strategy", args.strategy, "--batch-size", str(args.batch_size), "--threads", str(args.threads),
           "--requests", str(args.requests)] + (["--draft-model", args.draft_model] if args.draft_model else [])
    proc = start(cmd, url)
    try:
        strategies = [args.strategy, "ngram", "none"]
        # warm-up: the same load as the measured rounds (every group at full batch once), so
        # that the baseline holds what a warm server keeps (pipelines, draft models, buffers)
        warm = fault_round(args.requests, len(prompts), strategies, rng)
        asyncio.run(run_round(url, warm, prompts, args.max_tokens, "m", "warm-up"))
        asyncio.run(run_round(url, [Spec("plain", i % len(prompts), args.strategy) for i in range(args.requests)],
                              prompts, args.max_tokens, "m", "warm-up"))
        wait_idle(url)
        time.sleep(1)  # the server trims its heap when it goes idle
        baseline = rss(proc.pid)
        specs = fault_round(args.requests, len(prompts), strategies, rng)
        results, wall = asyncio.run(run_round(url, specs, prompts, args.max_tokens, "m", "fault round"))
        failures += check_fault_round(results, want)
        kinds = {k: sum(1 for s in specs if s.kind == k) for k in ("plain", "stream", "disconnect", "malformed")}
        kinds["flaky"] = sum(1 for s in specs if s.strategy == "flaky" and s.kind in ("plain", "stream"))
        flaky_failures = metric(url, 'lightspec:step_failures_total{strategy="flaky"}')
        report["fault_round"] = {**summary(results, wall), "kinds": kinds, "flaky_step_failures": flaky_failures}
        if kinds["flaky"] and not flaky_failures:
            failures.append("the flaky drafter never failed: the fault was not exercised")
        for label, strategy in (("speculation_on", args.strategy), ("speculation_off", "none")):
            specs = [Spec("plain", i % len(prompts), strategy) for i in range(args.requests)]
            results, wall = asyncio.run(run_round(url, specs, prompts, args.max_tokens, "m", label))
            failures += check_fault_round(results, want, label)
            report[label] = summary(results, wall)
        idle = wait_idle(url)
        time.sleep(1)
        after = rss(proc.pid)
        report["rss"] = {"warm_baseline_mb": round(baseline / 2**20, 1), "after_mb": round(after / 2**20, 1),
                         "ratio": round(after / baseline, 3)}
        if not idle:
            failures.append("the server still had running or waiting requests after the load")
        if after > 1.10 * baseline:
            failures.append(f"RSS grew from {baseline / 2**20:.0f} MB to {after / 2**20:.0f} MB (> 10%)")
    finally:
        stop(proc)
    if not args.no_hf:
        try:
            report["transformers_serve"] = hf_round(args, prompts)
        except SystemExit as exc:  # its failure to start is reported, the rest of the run stands
            report["transformers_serve"] = {"error": str(exc)[-1000:]}
    report["failures"] = failures
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


def _deadline(signum, frame):
    raise SystemExit("the load test ran past --deadline-s; its servers are stopped")


def metric(url: str, series: str) -> float:
    import httpx

    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def wait_idle(url: str, timeout: float = 120) -> bool:
    import httpx

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        h = httpx.get(url + "/health", timeout=10).json()
        if h["running"] == 0 and h["waiting"] == 0:
            return True
        time.sleep(0.2)
    return False


def check_fault_round(results: list[Result], want: list[str], label: str = "fault round") -> list[str]:
    out = []
    for i, r in enumerate(results):
        s = r.spec
        if s.kind == "malformed":
            if r.status != s.expect or r.error:
                out.append(f"{label} #{i}: malformed body got {r.status} (want {s.expect}) {r.error or ''}")
        elif s.kind != "disconnect":
            if r.status != 200 or r.error:
                out.append(f"{label} #{i} ({s.kind}, {s.strategy}): status {r.status}, error {r.error}")
            elif r.text != want[s.prompt]:
                out.append(f"{label} #{i} ({s.kind}, {s.strategy}): text differs from offline greedy: "
                           f"{r.text!r} != {want[s.prompt]!r}")
    return out


def hf_round(args, prompts: list[str]) -> dict:
    """The same plain greedy load against ``transformers serve`` on the same model folder."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    exe = Path(sys.executable).with_name("transformers")
    cmd = [str(exe), "serve", args.model, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
           "--dtype", "float32", "--log-level", "error"]
    proc = start(cmd, url, env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    try:
        specs = [Spec("plain", i % len(prompts)) for i in range(args.requests)]
        asyncio.run(run_round(url, specs[:4], prompts, args.max_tokens, args.model))
        results, wall = asyncio.run(run_round(url, specs, prompts, args.max_tokens, args.model, "transformers serve"))
        out = summary(results, wall)
        out["errors"] = sorted({r.error[:200] for r in results if r.error})[:3]
        return out
    finally:
        stop(proc)


def load_prompts() -> list[str]:
    """Short prompts from the zoo's code and prose sets (at most 400 characters each)."""
    base = ROOT / "zoo" / "src" / "lightspec_zoo" / "prompts"
    out = []
    for name in ("code.jsonl", "prose.jsonl", "edit.jsonl"):
        path = base / name
        if path.exists():
            for line in path.read_text().splitlines()[:8]:
                if line.strip():
                    out.append(json.loads(line)["prompt"][:400])
    return out or ["def fibonacci(n):", "The quick brown fox", "import os\nimport sys\n"]


if __name__ == "__main__":
    sys.exit(main())
