#!/usr/bin/env python3
"""TPC-H SQL side by side: `spilljoin sql`, stock DataFusion and DuckDB, per memory limit.

    python3 benches/compare/sql.py --sf 1 --limits none,1GiB,256MiB,64MiB,16MiB

- spilljoin: `target/release/spilljoin sql` (DataFusion 55.2 with SpilljoinRule).
- datafusion: the same binary with `SET spilljoin.enabled = false`: the same DataFusion version,
  configuration, pool (fair spill pool of the limit) and file reading, with its own
  HashJoinExec. The difference between the two columns is the join alone.
- duckdb: DuckDB (Python package) with `memory_limit` and 2 threads.

Each (engine, query, limit) runs in a fresh process (see run.py's run_child: peak RSS is
the engine's own). Queries are datafusion/tests/tpch/q*.sql, data is
data/tpch-sf<SF>/ (made with tpchgen-cli if missing). Prints a Markdown table of wall
time, peak RSS and the error where one fails, and writes it to --out.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import run as common

HERE = Path(__file__).resolve().parent
QUERIES = common.REPO / "datafusion" / "tests" / "tpch"
TPCH = ("customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier")


def data_dir(sf: float) -> Path:
    path = common.DATA / f"tpch-sf{sf:g}"
    if not all((path / f"{t}.parquet").exists() for t in TPCH):
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run([common.tool("tpchgen-cli"), "parquet", "-s", f"{sf:g}", "-o", str(path)],
                       check=True)
    return path


def parse_limit(text: str) -> int | None:
    if text == "none":
        return None
    m = re.fullmatch(r"(\d+)(KiB|MiB|GiB)", text)
    if not m:
        raise SystemExit(f"limit {text!r}: expected none or N KiB/MiB/GiB")
    return int(m.group(1)) << {"KiB": 10, "MiB": 20, "GiB": 30}[m.group(2)]


def spilljoin_cmd(engine: str, query: Path, data: Path, limit: int | None, threads: int,
                  scratch: Path) -> list[str]:
    cmd = [str(common.spilljoin_binary()), "sql", "--threads", str(threads), "--quiet",
           "--output", "-", "--output-format", "csv", "--spill-dir", str(scratch)]
    for t in TPCH:
        cmd += ["--table", f"{t}={data / (t + '.parquet')}"]
    if limit is not None:
        cmd += ["--memory-limit", f"{limit}B"]
    if engine == "datafusion":
        # The same binary and session with the rule off: stock HashJoinExec.
        stock = scratch / query.name
        stock.write_text("SET spilljoin.enabled = false;\n" + query.read_text())
        query = stock
    return cmd + ["--file", str(query)]


def duckdb_child(task: dict) -> None:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {task['threads']}")
    con.execute(f"SET temp_directory = '{task['scratch']}'")
    if task["limit"] is not None:
        con.execute(f"SET memory_limit = '{task['limit']}B'")
    for t in TPCH:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{task['data']}/{t}.parquet')")
    rows = 0
    for statement in Path(task["query"]).read_text().split(";"):
        if statement.strip():
            result = con.execute(statement).fetchall()
            rows = len(result)
    print(f"RESULT {json.dumps({'rows': rows})}", flush=True)


def run_one(engine: str, query: Path, data: Path, limit: int | None, opts) -> dict:
    with tempfile.TemporaryDirectory(dir=opts.scratch) as work:
        work = Path(work)
        if engine == "duckdb":
            task = {"threads": opts.threads, "scratch": str(work), "limit": limit,
                    "data": str(data), "query": str(query)}
            cmd = [sys.executable, __file__, "--duckdb-child", json.dumps(task)]
        else:
            cmd = spilljoin_cmd(engine, query, data, limit, opts.threads, work)
        r = common.run_child(cmd, common.child_env(opts.threads, work), opts.timeout, work)
    if r["timed_out"]:
        r["error"] = f"timeout after {opts.timeout:.0f} s"
    elif r["rc"] != 0:
        lines = [l for l in (r["stderr"] + r["stdout"]).splitlines() if l.strip()]
        r["error"] = common.first_line(next((l for l in lines if "rror" in l or "xhausted" in l),
                                            lines[-1] if lines else f"exit {r['rc']}"), 90)
    return r


def cell(r: dict) -> str:
    if "error" in r:
        return f"fails: {r['error']}"
    return f"{r['wall']:.2f} s, {common.mib(r['rss'])} MiB"


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duckdb-child")
    p.add_argument("--sf", type=float, default=1)
    p.add_argument("--limits", default="none,1GiB,256MiB,64MiB,16MiB")
    p.add_argument("--engines", default="spilljoin,datafusion,duckdb")
    p.add_argument("--queries", default="1-22")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--scratch", default=None)
    p.add_argument("--out", default=None)
    opts = p.parse_args(argv)
    if opts.duckdb_child:
        return duckdb_child(json.loads(opts.duckdb_child))
    data = data_dir(opts.sf)
    first, _, last = opts.queries.partition("-")
    numbers = range(int(first), int(last or first) + 1)
    engines = opts.engines.split(",")
    limits = opts.limits.split(",")
    header = f"| query | limit | {' | '.join(engines)} |"
    lines = [f"`{' '.join(['python3', 'benches/compare/sql.py', *argv])}`, "
             f"{time.strftime('%Y-%m-%d')}", "", header,
             "|" + "---|" * (len(engines) + 2)]
    print("\n".join(lines), flush=True)
    for n in numbers:
        query = QUERIES / f"q{n}.sql"
        for limit_text in limits:
            limit = parse_limit(limit_text)
            cells = [cell(run_one(e, query, data, limit, opts)) for e in engines]
            line = f"| Q{n} | {limit_text} | {' | '.join(cells)} |"
            print(line, flush=True)
            lines.append(line)
    if opts.out:
        Path(opts.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
