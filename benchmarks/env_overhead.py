"""What ``env.step`` adds to one tool call, against a bare httpx round trip of the same request.

Question: is the env a thin layer over HTTP, or does it cost real time per step?

On one ``example_multi_step`` server, in one run, interleaved in random order, many times:

- ``env.step`` of one ``get_synonym_value`` call (a list with one ``function_call`` item,
  what a policy hands the env), on a ``NemoGymEnv`` whose episode stays open;
- the bare round trip: a synchronous ``httpx.Client`` POST of the same body to the same
  route with the same session cookie (what a hand-written client would do);
- for the breakdown, the env's own client alone: ``ResourcesClient.post_raw`` of the same
  request, run from this thread on the background loop (the thread hop included);
- and the floor: the same request bytes written on a blocking keep-alive socket, the reply
  read up to its ``Content-Length`` (no HTTP library at all).

Reported: medians (and p90) of each, and ``env.step`` / bare httpx. Target: within 1.2x.

Usage::

    python benchmarks/env_overhead.py              # 2,000 repetitions
    python benchmarks/env_overhead.py --reps 300   # quicker

Writes ``benchmarks/results/env_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness

SYNONYMS = ["Famished", "Ravenous", "Peckish", "Clamorous", "Deafening", "Wee", "Minuscule"]
RESET_EVERY = 200
ROUTE = "/get_synonym_value"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2000, help="repetitions of each measurement")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="seed of the interleaving order")
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="env_overhead")
    return parser.parse_args(argv)


class RawSocket:
    """A blocking keep-alive HTTP/1.1 connection that knows just enough to read a Content-Length reply."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.netloc = parts.netloc
        self.sock = socket.create_connection((parts.hostname, parts.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def post(self, route: str, body: bytes, cookie: str) -> str:
        head = (f"POST {route} HTTP/1.1\r\nhost: {self.netloc}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\ncookie: {cookie}\r\n\r\n").encode()
        self.sock.sendall(head + body)
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.sock.recv(65536)
        header, _, rest = self.buffer.partition(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in header.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(rest) < length:
            rest += self.sock.recv(65536)
        self.buffer = rest[length:]
        return rest[:length].decode()

    def close(self) -> None:
        self.sock.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import httpx

    from nemo_gym_env.client.loop import background_loop
    from nemo_gym_env.envs.env import NemoGymEnv

    args = parse_args(argv)
    order = random.Random(args.seed)
    times: dict[str, list[float]] = {"env_step": [], "httpx": [], "client": [], "socket": []}
    with harness.launched() as (proc,):
        env = NemoGymEnv(base_url=proc.url, dataset=harness.tasks(), max_steps=10**9)
        http = httpx.Client(trust_env=False, timeout=60.0)
        loop = background_loop()
        raw = RawSocket(proc.url)
        try:
            for rep in range(args.warmup + args.reps):
                if rep % RESET_EVERY == 0:
                    env.reset(seed=rep)
                episode = env.episode
                synonym = SYNONYMS[rep % len(SYNONYMS)]
                arguments = {"synonym": synonym}
                action = [{"type": "function_call", "name": "get_synonym_value",
                           "arguments": json.dumps(arguments), "call_id": f"call_{rep}"}]
                content = json.dumps(arguments, ensure_ascii=False, allow_nan=False).encode()
                headers = {"content-type": "application/json",
                           "cookie": "; ".join(f"{k}={v}" for k, v in episode.cookies.items())}
                cookie = headers["cookie"]
                jar = dict(episode.cookies)
                steps = [
                    ("env_step", lambda a=action: env.step(a)[0][0]["output"]),
                    ("httpx", lambda u=proc.url + ROUTE, c=content, h=headers: http.post(u, content=c, headers=h).text),
                    ("client", lambda a=arguments, j=jar: loop.run(env.client.post_raw(ROUTE, a, j)).text),
                    ("socket", lambda c=content, k=cookie: raw.post(ROUTE, c, k)),
                ]
                order.shuffle(steps)
                outputs: dict[str, str] = {}
                for name, run in steps:
                    t0 = time.perf_counter()
                    outputs[name] = run()
                    elapsed = time.perf_counter() - t0
                    if rep >= args.warmup:
                        times[name].append(elapsed)
                if len(set(outputs.values())) != 1:
                    raise AssertionError(f"the requests disagree: {outputs}")
        finally:
            raw.close()
            http.close()
            env.close()
    summary = {
        name: {"median_us": harness.median(v) * 1e6, "p90_us": harness.percentile(v, 90) * 1e6, "count": len(v)}
        for name, v in times.items()
    }
    ratio = summary["env_step"]["median_us"] / summary["httpx"]["median_us"]
    results = {
        "reps": args.reps,
        "request": "POST /get_synonym_value with the episode's session cookie",
        "timings": summary,
        "ratio_env_step_over_httpx": ratio,
        "ratio_env_step_over_client": summary["env_step"]["median_us"] / summary["client"]["median_us"],
        "ratio_env_step_over_socket": summary["env_step"]["median_us"] / summary["socket"]["median_us"],
        "target": {"ratio_env_step_over_httpx_at_most": 1.2},
    }
    harness.print_table(
        ["measurement", "median us", "p90 us", "x bare httpx"],
        [[name, s["median_us"], s["p90_us"], s["median_us"] / summary["httpx"]["median_us"]]
         for name, s in summary.items()],
        title=f"one tool call, {args.reps} interleaved repetitions",
    )
    print(f"\nenv.step / bare httpx = {ratio:.2f} (target <= 1.2)")
    path = harness.write_results(args.name, results, args.out)
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
