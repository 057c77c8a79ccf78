#!/usr/bin/env python3
"""DataFusion's join failure matrix workload, side by side (issue 29).

Two Parquet tables of 20M rows, an integer key and a 40-byte string payload, joined
on the key under a 300 MB limit, 2 threads (apache/datafusion#24779):

    benches/compare/.venv/bin/python benches/compare/df_join.py [--rows N] [--limit 300MB]

- `spilljoin join`: the command line on the two files.
- `spilljoin sql`: the same join through DataFusion 55.2 with SpilljoinRule, fair pool.
- `datafusion`: the same binary and session with `SET spilljoin.enabled = false`.

Data goes to data/dfjoin-<rows>/ (seeded; made once). Prints wall time, peak RSS
(GNU time) and the error where a run fails.
"""
from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import run as common

PAYLOAD = 40


def table(path: Path, rows: int, seed: int, unique: bool) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    keys = rng.permutation(rows) if unique else rng.integers(0, rows, rows)
    writer = None
    step = 1 << 20
    for start in range(0, rows, step):
        n = min(step, rows - start)
        data = rng.integers(97, 123, n * PAYLOAD, dtype=np.uint8).tobytes()
        offsets = np.arange(0, n * PAYLOAD + 1, PAYLOAD, dtype=np.int32).tobytes()
        payload = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))
        batch = pa.record_batch([pa.array(keys[start:start + n], pa.int64()), payload],
                                names=["k", "s"])
        if writer is None:
            writer = pq.ParquetWriter(path, batch.schema)
        writer.write_batch(batch)
    writer.close()


def data(rows: int) -> Path:
    d = common.DATA / f"dfjoin-{rows}"
    if not (d / "b.parquet").exists():
        d.mkdir(parents=True, exist_ok=True)
        table(d / "a.parquet", rows, 1, unique=True)
        table(d / "b.parquet", rows, 2, unique=False)
    return d


QUERY = "SELECT count(*), sum(length(a.s)), sum(length(b.s)) FROM a JOIN b ON a.k = b.k"


def commands(d: Path, limit: str, scratch: Path) -> dict[str, list[str]]:
    binary = str(common.spilljoin_binary())
    tables = ["--table", f"a={d / 'a.parquet'}", "--table", f"b={d / 'b.parquet'}"]
    sql = [binary, "sql", *tables, "--threads", "2", "--memory-limit", limit,
           "--spill-dir", str(scratch), "--output", "-", "--output-format", "csv"]
    return {
        "spilljoin join": [binary, "join", "--left", str(d / "b.parquet"), "--right",
                           str(d / "a.parquet"), "--on", "k=k", "--threads", "2",
                           "--memory-limit", limit, "--spill-dir", str(scratch)],
        "spilljoin sql": [*sql, QUERY],
        "datafusion": [*sql, f"SET spilljoin.enabled = false; {QUERY}"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000_000)
    p.add_argument("--limit", default="300MB")
    p.add_argument("--timeout", type=float, default=600)
    opts = p.parse_args()
    started = time.monotonic()
    d = data(opts.rows)
    print(f"data ready in {time.monotonic() - started:.0f} s: {d}", flush=True)
    print(f"| engine | {opts.limit} |\n|---|---|")
    scratch = common.DATA / "dfjoin-scratch"
    scratch.mkdir(exist_ok=True)
    for name, cmd in commands(d, opts.limit, scratch).items():
        r = common.run_child(cmd, common.child_env(2, scratch), opts.timeout, scratch)
        if r["rc"] == 0 and not r["timed_out"]:
            cell = f"{r['wall']:.2f} s, RSS {common.mib(r['rss'])} MiB"
        else:
            lines = [l for l in (r["stderr"] + r["stdout"]).splitlines() if l.strip()]
            errors = [l for l in lines if "rror" in l or "xhausted" in l]
            why = (errors or lines or [f"exit {r['rc']}"])[0]
            cell = "fails: " + common.first_line(why, 200)
        print(f"| {name} | {cell} |", flush=True)


if __name__ == "__main__":
    main()
