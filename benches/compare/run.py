#!/usr/bin/env python3
"""Side-by-side join benchmark: spilljoin vs DuckDB, DataFusion and Polars.

Every engine reads the same TPC-H Parquet files, runs the same join under the same
memory limit and consumes the whole result (SQL engines aggregate it; spilljoin
produces every output batch). Each (engine, join, limit) runs in a fresh child
process so its peak RSS is its own; see README.md beside this file.

    python3 benches/compare/run.py --sf 1 --joins inner,semi --memory-limits none,25%

The parent never imports an engine. A child is either the spilljoin binary or this
script re-run with `--child JSON`, which imports one engine, runs one query and prints
one `RESULT {...}` line.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DATA = HERE / "data"
TABLES = ("orders", "lineitem", "customer")
GNU_TIME = shutil.which("time", path="/usr/bin:/bin")  # the binary, not the shell keyword
AIR = "AIR"  # l_shipmode value of the filtered variants (about 1/7 of lineitem)
# The skew dataset (--skew): orders/lineitem with the join key rewritten; see write_skew.
SKEW_TABLES = ("orders_skew", "lineitem_skew")
SKEW_SEED = 20240601
SKEW_HOT_SHARE = 0.20  # share of the build (orders) rows on the one hot key
SKEW_HOT_PROBE_ROWS = 5  # lineitem rows on the hot key: keeps the output small
SKEW_ZIPF_A = 1.2  # numpy zipf exponent of every other key, on both sides
SKEW_MAX_OUTPUT_PER_SF = 10_000_000  # refuse a dataset whose inner join would be bigger
# (10M output rows per unit of scale factor: about 1.3x orders ⋈ lineitem)
# Time targets of spilljoin under a limit, as a multiple of its unlimited time (--summary).
SLOWDOWN_TARGETS = {"25%": 1.5, "5%": 2.5}


@dataclass(frozen=True)
class Join:
    """One benchmark join, stated in SQL terms.

    `left` is the FROM side: the side whose rows a left/semi/anti/not-in join keeps.
    `build` says which SQL side spilljoin builds its hash table on (spilljoin's RIGHT
    input); memory limits given in % are a share of that side's projected Arrow size.
    """

    left: str
    right: str
    left_key: str
    right_key: str
    kind: str  # inner | left | semi | anti | not_in
    build: str  # "left" | "right"
    left_col: str  # aggregated column of the left side
    right_col: str | None  # aggregated column of the right side (None: right is only a filter)
    sql: str  # shared verbatim by DuckDB and DataFusion
    right_filter: bool = False  # right side restricted to l_shipmode = 'AIR'
    # Further columns the result must carry through the join (aggregated as in
    # PAYLOAD_AGG), and whether spilljoin outputs every column of both sides.
    payload: tuple[str, ...] = ()
    all_columns: bool = False

    def columns_of(self, table: str) -> list[str] | None:
        """The projected columns of `table` (None: all of them)."""
        if self.all_columns:
            return None
        key = self.left_key if table == self.left else self.right_key
        col = self.left_col if table == self.left else self.right_col
        prefix = key.split("_")[0] + "_"
        extra = [c for c in self.payload if c.startswith(prefix)]
        return list(dict.fromkeys([key] + ([col] if col else []) + extra))


def orders_lineitem(kind: str, sql: str, right_col: str | None = None, build: str = "left",
                    right_filter: bool = False) -> Join:
    return Join("orders", "lineitem", "o_orderkey", "l_orderkey", kind, build, "o_totalprice",
                right_col, sql, right_filter)


SUM_O = "SELECT count(*), sum(o_totalprice)"
# TPC-H orders and lineitem columns by kind. Strings: o_orderstatus, l_returnflag,
# l_linestatus 1 byte; o_orderpriority 5-15, l_shipmode 3-7 (short: inline in a view);
# o_clerk 15, l_shipinstruct 4-17; o_comment 19-78, l_comment 10-43 (long).
STRINGS = ("o_orderstatus", "o_orderpriority", "o_clerk", "o_comment", "l_returnflag",
           "l_linestatus", "l_shipinstruct", "l_shipmode", "l_comment")
DATES = ("o_orderdate", "l_shipdate", "l_commitdate", "l_receiptdate")
NUMBERS = ("o_orderkey", "o_custkey", "o_totalprice", "o_shippriority", "l_orderkey",
           "l_partkey", "l_suppkey", "l_linenumber", "l_quantity", "l_extendedprice",
           "l_discount", "l_tax")
# The short and long strings of both tables (inner_strings).
STRING_PAYLOAD = ("o_orderpriority", "o_comment", "l_shipmode", "l_comment")
# Every column but the two aggregated in SUM_O's joins (inner_all).
ALL_PAYLOAD = tuple(c for c in NUMBERS + DATES + STRINGS
                    if c not in ("o_totalprice", "l_extendedprice"))


def payload_sql(column: str) -> str:
    """An aggregate that needs every value of `column` (so that engines carry it)."""
    if column in STRINGS:
        return f"sum(length({column}))"
    if column in DATES:
        return f"sum(extract(day FROM {column}))"
    return f"sum({column})"


def with_payload(kind: str, payload: tuple[str, ...], all_columns: bool = False) -> Join:
    """orders ⋈ lineitem (built on orders) whose result carries `payload` too."""
    aggs = ", ".join(payload_sql(c) for c in payload)
    sql = (f"{SUM_O}, sum(l_extendedprice), {aggs} "
           "FROM orders JOIN lineitem ON o_orderkey = l_orderkey")
    return Join("orders", "lineitem", "o_orderkey", "l_orderkey", kind, "left", "o_totalprice",
                "l_extendedprice", sql, payload=payload, all_columns=all_columns)


SKEW_JOINS = ("skew_inner",)  # need the --skew dataset; not part of 'all' without --skew
JOINS = {
    "inner": orders_lineitem(
        "inner", f"{SUM_O}, sum(l_extendedprice) FROM orders JOIN lineitem ON o_orderkey = l_orderkey",
        right_col="l_extendedprice"),
    "left": orders_lineitem(  # preserves orders (the build side)
        "left", f"{SUM_O}, sum(l_extendedprice) FROM orders LEFT JOIN lineitem ON o_orderkey = l_orderkey",
        right_col="l_extendedprice"),
    "semi": orders_lineitem(
        "semi", f"{SUM_O} FROM orders WHERE EXISTS (SELECT 1 FROM lineitem WHERE l_orderkey = o_orderkey)"),
    "anti": orders_lineitem(  # 0 rows on TPC-H: every order has a line item
        "anti", f"{SUM_O} FROM orders WHERE NOT EXISTS "
        "(SELECT 1 FROM lineitem WHERE l_orderkey = o_orderkey)"),
    "anti_filtered": orders_lineitem(
        "anti", f"{SUM_O} FROM orders WHERE NOT EXISTS "
        f"(SELECT 1 FROM lineitem WHERE l_orderkey = o_orderkey AND l_shipmode = '{AIR}')",
        right_filter=True),
    "customer_orders": Join(
        "customer", "orders", "c_custkey", "o_custkey", "inner", "left", "c_acctbal", "o_totalprice",
        "SELECT count(*), sum(c_acctbal), sum(o_totalprice) "
        "FROM customer JOIN orders ON c_custkey = o_custkey"),
    "not_in": orders_lineitem(  # null-aware anti join, built on the subquery side
        "not_in", f"{SUM_O} FROM orders WHERE o_orderkey NOT IN "
        f"(SELECT l_orderkey FROM lineitem WHERE l_shipmode = '{AIR}')",
        build="right", right_filter=True),
    # The payload joins: short and long strings of both sides, and every column
    # (what the CLI outputs without --select).
    "inner_strings": with_payload("inner", STRING_PAYLOAD),
    "inner_all": with_payload("inner", ALL_PAYLOAD, all_columns=True),
    "skew_inner": Join(  # one key holds 20 % of orders_skew, 5 rows of lineitem_skew
        "orders_skew", "lineitem_skew", "o_orderkey", "l_orderkey", "inner", "left",
        "o_totalprice", "l_extendedprice",
        f"{SUM_O}, sum(l_extendedprice) FROM orders_skew JOIN lineitem_skew ON o_orderkey = l_orderkey"),
}

# spilljoin's --type when the SQL left side is its build (RIGHT) input.
SWAPPED_TYPE = {"inner": "inner", "left": "right", "semi": "right-semi", "anti": "right-anti"}
SPILLJOIN_TYPE = {"inner": "inner", "left": "left", "semi": "semi", "anti": "anti", "not_in": "not-in"}

ENGINES = ("spilljoin", "duckdb", "datafusion-hj", "datafusion-smj", "polars", "polars-inmem")
ENGINE_ALIASES = {"datafusion": ("datafusion-hj", "datafusion-smj")}
NO_LIMIT_ENGINES = ("polars", "polars-inmem")  # cannot bound their memory
PY_MODULE = {"duckdb": "duckdb", "datafusion-hj": "datafusion", "datafusion-smj": "datafusion",
             "polars": "polars", "polars-inmem": "polars"}
DEFAULT_ENGINES = "spilljoin,duckdb,datafusion,polars"
UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20,
         "g": 1e9, "gb": 1e9, "gib": 2**30}


# ----------------------------------------------------------------------------- data

def sf_dir(sf: float) -> Path:
    return DATA / f"sf{sf:g}"


def table_paths(sf: float) -> dict[str, str]:
    d = sf_dir(sf)
    paths = {t: str(d / f"{t}.parquet") for t in TABLES}
    paths["lineitem_air"] = str(d / "lineitem_air.parquet")
    paths.update({t: str(d / f"{t}.parquet") for t in SKEW_TABLES})
    return paths


def tool(name: str) -> str:
    """A console script of the running interpreter's environment, else one on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def generate_tpch(sf: float, threads: int) -> None:
    d = sf_dir(sf)
    if all((d / f"{t}.parquet").exists() for t in TABLES):
        return
    tmp = d.with_name(d.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [tool("tpchgen-cli"), "parquet", "-s", f"{sf:g}", "-T", ",".join(TABLES),
           "-n", str(threads), "-o", str(tmp)]
    log(f"generating TPC-H SF{sf:g}: {shlex.join(cmd)}")
    start = time.monotonic()
    subprocess.run(cmd, check=True)
    d.mkdir(parents=True, exist_ok=True)
    for t in TABLES:
        (tmp / f"{t}.parquet").rename(d / f"{t}.parquet")
    tmp.rmdir()
    log(f"generated SF{sf:g} in {time.monotonic() - start:.1f} s")


def read_batches(path: str, columns: list[str] | None = None, air_only: bool = False):
    """Record batches of one Parquet file, string_view read as string (pyarrow's compute
    kernels do not take string_view); air_only keeps l_shipmode = 'AIR' rows."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    read = None if columns is None else columns + (["l_shipmode"] if air_only else [])
    for batch in pq.ParquetFile(path).iter_batches(columns=read):
        batch = batch.cast(pa.schema([f.with_type(pa.string()) if f.type == pa.string_view()
                                      else f for f in batch.schema]))
        if air_only:
            batch = batch.filter(pc.equal(batch["l_shipmode"], AIR))
        yield batch if columns is None else batch.select(columns)


def write_filtered_lineitem(sf: float) -> None:
    """spilljoin's CLI has no filter: give it lineitem WHERE l_shipmode = 'AIR' as a file."""
    import pyarrow.parquet as pq

    out = Path(table_paths(sf)["lineitem_air"])
    if out.exists():
        return
    tmp, writer = out.with_suffix(".tmp"), None
    for batch in read_batches(table_paths(sf)["lineitem"], air_only=True):
        writer = writer or pq.ParquetWriter(tmp, batch.schema)
        writer.write_batch(batch)
    writer.close()
    tmp.rename(out)


def build_side_bytes(sf: float) -> None:
    """Arrow in-memory size of each join's projected build columns (cached as JSON)."""
    cache = sf_dir(sf) / "build_sizes.json"
    sizes = json.loads(cache.read_text()) if cache.exists() else {}
    for name, j in JOINS.items():
        table = j.left if j.build == "left" else j.right
        cols = j.columns_of(table)
        air = j.right_filter and j.build == "right"
        if name in sizes and sizes[name].get("columns") == cols:
            continue
        if not Path(table_paths(sf)[table]).exists():
            continue
        # (Strings read as Utf8: their bytes, whatever the reader's views share.)
        batches = list(read_batches(table_paths(sf)[table], cols, air_only=air))
        sizes[name] = {"table": table + (f" ({AIR})" if air else ""), "columns": cols,
                       "rows": sum(b.num_rows for b in batches),
                       "bytes": sum(b.nbytes for b in batches)}
    cache.write_text(json.dumps(sizes, indent=1))


def write_skew(sf: float) -> None:
    """orders_skew / lineitem_skew: orders and lineitem with the join key rewritten.

    Every other column and the row counts are kept; only o_orderkey / l_orderkey change.
    The key set K is orders' own o_orderkey values. Build (orders_skew): exactly
    SKEW_HOT_SHARE of the rows get one hot key; every other row gets the key of rank
    (Z - 1) mod (|K| - 1), Z ~ numpy zipf(SKEW_ZIPF_A), over the remaining keys.
    Probe (lineitem_skew): SKEW_HOT_PROBE_ROWS rows get the hot key; every other row
    is drawn from the same zipf over the same keys, but the probe ranks the keys in its
    own order: first the keys orders_skew holds once, then twice, ... (its heaviest
    last), then the keys orders_skew lacks. With one shared order the zipf heads of the
    two sides would multiply to some 10^11 output rows at SF1 (see README.md); this way
    the probe's heavy hitters are build singletons, most probe rows match (as in TPC-H)
    and the output stays near lineitem's size. Seeded; the expected inner-join output
    is computed here, printed and kept in skew.json beside the data.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths, info_path = table_paths(sf), sf_dir(sf) / "skew.json"
    shape = {"seed": SKEW_SEED, "zipf_a": SKEW_ZIPF_A, "hot_share": SKEW_HOT_SHARE,
             "hot_probe_rows_wanted": SKEW_HOT_PROBE_ROWS, "probe_order": "build singletons first"}
    if info_path.exists() and all(Path(paths[t]).exists() for t in SKEW_TABLES):
        info = json.loads(info_path.read_text())
        if all(info.get(k) == v for k, v in shape.items()):  # else the constants changed
            print_skew(info)
            return
    start = time.monotonic()
    rng = np.random.default_rng(SKEW_SEED)
    keys = pq.read_table(paths["orders"], columns=["o_orderkey"])["o_orderkey"].to_numpy()
    n = len(keys)
    n_build, n_probe = n, pq.ParquetFile(paths["lineitem"]).metadata.num_rows
    order = rng.permutation(n)  # rank -> index into keys
    hot, build_order = order[0], order[1:]

    def draw(rank_order, rows, hot_rows):
        idx = rank_order[(rng.zipf(SKEW_ZIPF_A, rows) - 1) % (n - 1)]
        idx[rng.choice(rows, hot_rows, replace=False)] = hot
        return idx

    b = draw(build_order, n_build, round(SKEW_HOT_SHARE * n_build))
    bc = np.bincount(b, minlength=n)
    present, absent = build_order[bc[build_order] > 0], build_order[bc[build_order] == 0]
    probe_order = np.concatenate([present[np.argsort(bc[present], kind="stable")], absent])
    p = draw(probe_order, n_probe, SKEW_HOT_PROBE_ROWS)
    pc = np.bincount(p, minlength=n)
    output = int((bc * pc).sum())
    top_b, top_p = np.argsort(-bc)[:4], np.argsort(-pc)[:3]
    info = {
        **shape, "hot_key": int(keys[hot]), "build_rows": n_build, "probe_rows": n_probe,
        "hot_build_rows": int(bc[hot]), "hot_probe_rows": int(pc[hot]),
        "build_distinct_keys": int((bc > 0).sum()), "probe_distinct_keys": int((pc > 0).sum()),
        "probe_rows_matching": int(pc[bc > 0].sum()),
        "top_build_keys": [[int(keys[i]), int(bc[i]), int(pc[i])] for i in top_b],
        "top_probe_keys": [[int(keys[i]), int(bc[i]), int(pc[i])] for i in top_p],
        "expected_inner_rows": output,
    }
    max_output = int(SKEW_MAX_OUTPUT_PER_SF * max(sf, 1))
    if output > max_output:
        raise SystemExit(f"skew dataset would join to {output} rows (> {max_output}); "
                         "change SKEW_SEED or the shape")
    for table, key, values in (("orders", "o_orderkey", keys[b]), ("lineitem", "l_orderkey", keys[p])):
        src, out = pq.ParquetFile(paths[table]), Path(paths[f"{table}_skew"])
        tmp, at = out.with_suffix(".tmp"), 0
        col = src.schema_arrow.get_field_index(key)
        with pq.ParquetWriter(tmp, src.schema_arrow, compression="snappy") as w:
            for g in range(src.num_row_groups):  # keep the source's row groups
                t = src.read_row_group(g)
                t = t.set_column(col, src.schema_arrow.field(col),
                                 pa.array(values[at:at + t.num_rows], pa.int64()))
                w.write_table(t, row_group_size=t.num_rows)
                at += t.num_rows
        assert at == len(values), (table, at, len(values))
        tmp.rename(out)
    info_path.write_text(json.dumps(info, indent=1))
    log(f"wrote {', '.join(SKEW_TABLES)} in {time.monotonic() - start:.1f} s")
    print_skew(info)


def print_skew(info: dict) -> None:
    log(f"skew dataset: hot key {info['hot_key']} has {info['hot_build_rows']} of "
        f"{info['build_rows']} build rows and {info['hot_probe_rows']} of {info['probe_rows']} "
        f"probe rows; {info['build_distinct_keys']} / {info['probe_distinct_keys']} distinct keys; "
        f"{info['probe_rows_matching']} probe rows match; "
        f"expected skew_inner output: {info['expected_inner_rows']} rows")


def prepare(sf: float, threads: int, filtered: bool, skew: bool = False) -> None:
    generate_tpch(sf, threads)
    if filtered:
        write_filtered_lineitem(sf)
    if skew:
        write_skew(sf)
    build_side_bytes(sf)


def parse_limit(text: str, build_bytes: int) -> int | None:
    """'none' -> None; '25%' -> share of the build side; '64MiB' / '1e9' -> bytes."""
    text = text.strip().lower()
    if text == "none":
        return None
    if text.endswith("%"):
        return max(1, int(build_bytes * float(text[:-1]) / 100))
    m = re.fullmatch(r"([\d.e+]+)\s*([a-z]*)", text)
    if not m or m.group(2) not in UNITS:
        raise SystemExit(f"bad memory limit {text!r}")
    return int(float(m.group(1)) * UNITS[m.group(2)])


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


# ----------------------------------------------------------------------------- engines
# Each runs in a child process and returns the raw aggregate row [count, sum, sum?].

def run_duckdb(j: Join, paths: dict, limit: int | None, threads: int, scratch: str) -> list:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {threads}")
    con.execute(f"SET temp_directory = '{scratch}'")
    if limit is not None:
        con.execute(f"SET memory_limit = '{limit}B'")
    for t in dict.fromkeys((j.left, j.right)):
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{paths[t]}')")
    return list(con.execute(j.sql).fetchone())


def run_datafusion(j: Join, paths: dict, limit: int | None, threads: int, scratch: str,
                   hash_join: bool) -> list:
    from datafusion import RuntimeEnvBuilder, SessionConfig, SessionContext

    config = (SessionConfig().with_target_partitions(threads)
              .set("datafusion.optimizer.prefer_hash_join", str(hash_join).lower()))
    runtime = RuntimeEnvBuilder().with_disk_manager_specified(scratch)
    if limit is not None:
        runtime = runtime.with_fair_spill_pool(limit)
    ctx = SessionContext(config, runtime)
    for t in dict.fromkeys((j.left, j.right)):
        ctx.register_parquet(t, paths[t])
    row = ctx.sql(j.sql).to_arrow_table().to_pylist()[0]
    return list(row.values())


def run_polars(j: Join, paths: dict, streaming: bool) -> list:
    import polars as pl

    left, right = pl.scan_parquet(paths[j.left]), pl.scan_parquet(paths[j.right])
    if j.right_filter:
        right = right.filter(pl.col("l_shipmode") == AIR)
    engine = "streaming" if streaming else "in-memory"
    if j.kind == "not_in":
        # x NOT IN S: true for every row if S is empty; else false/unknown if S holds a
        # NULL or x is NULL; else x not in S.  Polars has no null-aware anti join.
        stats = right.select(n=pl.len(), nulls=pl.col(j.right_key).null_count()).collect(engine=engine)
        if stats["n"][0] == 0:
            joined = left
        elif stats["nulls"][0] > 0:
            joined = left.head(0)
        else:
            joined = left.filter(pl.col(j.left_key).is_not_null()).join(
                right, left_on=j.left_key, right_on=j.right_key, how="anti")
    else:
        # (Both keys kept where the payload aggregates them: Polars coalesces them.)
        joined = left.join(right, left_on=j.left_key, right_on=j.right_key, how=j.kind,
                           coalesce=False if j.payload else None)
    aggs = [pl.len()] + [pl.col(c).sum() for c in (j.left_col, j.right_col) if c]
    for c in j.payload:  # as payload_sql
        col = pl.col(c)
        if c in STRINGS:
            col = col.str.len_chars().cast(pl.Int64)
        elif c in DATES:
            col = col.dt.day().cast(pl.Int64)
        aggs.append(col.sum())
    return list(joined.select(aggs).collect(engine=engine).row(0))


def child_main(task: dict) -> None:
    """Run one query in this process and print `RESULT {json}`."""
    j, engine = JOINS[task["join"]], task["engine"]
    args = (j, task["paths"], task["limit"], task["threads"], task["scratch"])
    out = {"status": "ok"}
    if task.get("import_only"):
        __import__(PY_MODULE[engine])
        print("RESULT " + json.dumps(out), flush=True)
        return
    start = time.perf_counter()
    try:
        if engine == "duckdb":
            raw = run_duckdb(*args)
        elif engine.startswith("datafusion"):
            raw = run_datafusion(*args, hash_join=engine == "datafusion-hj")
        else:
            raw = run_polars(j, task["paths"], streaming=engine == "polars")
        out["result"] = normalize(raw)
    except Exception as e:  # engine errors are results too (OOM, resources exhausted)
        kind = "" if type(e) is Exception else f"{type(e).__name__}: "
        out = {"status": "error", "error": kind + first_line(str(e))}
    out["time"] = time.perf_counter() - start
    print("RESULT " + json.dumps(out), flush=True)


def normalize(raw: list) -> list:
    """[count, sums...] with sums as 2-decimal strings; sums of no rows are NULL."""
    n = int(raw[0])
    return [n] + [None if v is None or n == 0 else str(Decimal(str(v)).quantize(Decimal("0.01")))
                  for v in raw[1:]]


def first_line(text: str, width: int = 110) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return (lines[0] if lines else "")[:width]


# ----------------------------------------------------------------------------- spilljoin

def spilljoin_binary() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "release" / "spilljoin"


def ensure_spilljoin(rebuild: bool, threads: int) -> str | None:
    """Build the CLI if needed. Returns None when usable, else why not."""
    if spilljoin_binary().exists() and not rebuild:
        return None
    cmd = ["cargo", "build", "--release", "--bin", "spilljoin", "-j", str(threads)]
    log(f"building spilljoin: {shlex.join(cmd)}")
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"not built: {first_line(str(e))}"
    if done.returncode != 0 or not spilljoin_binary().exists():
        err = [l for l in done.stderr.splitlines() if l.startswith("error")] or [done.stderr]
        return f"not built: {first_line(err[0], 80)}"
    return None


def spilljoin_command(j: Join, paths: dict, limit: int | None, threads: int, scratch: str,
                      metrics: str) -> list[str]:
    """The build side is spilljoin's RIGHT input; swap and flip the type when needed."""
    right_table = "lineitem_air" if j.right_filter else j.right
    if j.build == "right":
        probe, build = (paths[j.left], j.left_key), (paths[right_table], j.right_key)
        join_type = SPILLJOIN_TYPE[j.kind]
    else:
        probe, build = (paths[right_table], j.right_key), (paths[j.left], j.left_key)
        join_type = SWAPPED_TYPE[j.kind]
    cmd = [str(spilljoin_binary()), "join", "--left", probe[0], "--right", build[0],
           "--on", f"{probe[1]}={build[1]}", "--type", join_type,
           "--threads", str(threads), "--spill-dir", scratch, "--metrics", metrics]
    if not j.all_columns:
        cmd += ["--select", ",".join(c for c in (j.left_col, j.right_col, *j.payload) if c)]
    if limit is not None:
        cmd += ["--memory-limit", f"{max(1, limit // 1024)}KiB"]
    return cmd


def parse_spilljoin(rc: int, stderr: str) -> dict:
    m = re.search(r"rows:\s*(\d+)\s+elapsed:\s*([\d.]+)\s*s", stderr)
    if rc == 0 and m:
        return {"status": "ok", "rows": int(m.group(1)), "time": float(m.group(2))}
    lines = [l for l in stderr.splitlines() if l.strip()]
    hit = [l for l in lines if re.search(r"error|exhausted|memory|panick", l, re.I)]
    return {"status": "error", "error": first_line((hit or lines or [f"exit code {rc}"])[0])}


# ----------------------------------------------------------------------------- running

def run_child(cmd: list[str], env: dict, timeout: float, workdir: Path) -> dict:
    """Run one process; return its wall time, peak RSS and CPU time.

    Peak RSS and CPU come from GNU time when installed: it is a tiny process, so its
    child's high-water mark is the engine's own. Otherwise they come from wait4's
    rusage, whose ru_maxrss cannot be below this script's own peak (see header).
    """
    timing = workdir / "time"
    if GNU_TIME:
        cmd = [GNU_TIME, "-f", "%M %U %S", "-o", str(timing), *cmd]
    with open(workdir / "stdout", "w+") as out, open(workdir / "stderr", "w+") as err:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True)
        timed_out = False
        try:
            while not (reaped := os.wait4(proc.pid, os.WNOHANG))[0]:
                if time.monotonic() - start > timeout:
                    os.killpg(proc.pid, signal.SIGKILL)
                    reaped, timed_out = os.wait4(proc.pid, 0), True
                    break
                time.sleep(0.01)
        except BaseException:  # Ctrl-C: the child is in its own session, end it too
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        wall = time.monotonic() - start
        _, status, usage = reaped
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        rss, cpu = usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime
        if timed_out:  # GNU time was killed too: its rusage is not the engine's
            rss = cpu = None
        if GNU_TIME and timing.exists():
            text = timing.read_text()
            if m := re.search(r"terminated by signal (\d+)", text):
                rc = -int(m.group(1))
            if m := re.search(r"^(\d+) ([\d.]+) ([\d.]+)\s*$", text, re.M):
                rss, cpu = int(m.group(1)) * 1024, float(m.group(2)) + float(m.group(3))
        out.seek(0), err.seek(0)
        return {"wall": wall, "rss": rss, "cpu": cpu, "rc": rc, "timed_out": timed_out,
                "stdout": out.read(), "stderr": err.read()}


def run_one(engine: str, join: str, limit: int | None, opts, paths: dict, env: dict,
            import_only: bool = False) -> dict:
    scratch = DATA / "scratch" / f"{engine}-{join}-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "spill").mkdir(parents=True)
    if engine == "spilljoin":
        cmd = spilljoin_command(JOINS[join], paths, limit, opts.threads,
                                str(scratch / "spill"), str(scratch / "metrics.json"))
    else:
        task = {"engine": engine, "join": join, "paths": paths, "limit": limit,
                "threads": opts.threads, "scratch": str(scratch / "spill"),
                "import_only": import_only}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(task)]
    p = run_child(cmd, env, opts.timeout, scratch)
    if p["timed_out"]:
        res = {"status": "error", "error": f"timeout after {opts.timeout:g} s"}
    elif engine == "spilljoin":
        res = parse_spilljoin(p["rc"], p["stderr"])
        metrics = scratch / "metrics.json"
        if metrics.exists():
            try:
                res["metrics"] = json.loads(metrics.read_text())
            except ValueError as e:
                res["metrics_error"] = first_line(str(e))
    else:
        lines = [l for l in p["stdout"].splitlines() if l.startswith("RESULT ")]
        if lines:
            res = json.loads(lines[-1][len("RESULT "):])
        elif p["rc"] < 0:
            res = {"status": "error", "error": f"killed by signal {-p['rc']}"
                   + (" (OOM killer?)" if p["rc"] == -9 else "")}
        else:
            res = {"status": "error", "error": first_line(p["stderr"]) or f"exit {p['rc']}"}
    if "result" in res:
        res["rows"] = res["result"][0]
    shutil.rmtree(scratch, ignore_errors=True)
    return {**res, "wall": p["wall"], "rss": p["rss"], "cpu": p["cpu"]}


def child_env(threads: int, scratch: Path) -> dict:
    env = dict(os.environ)
    env.update({"POLARS_MAX_THREADS": str(threads), "TOKIO_WORKER_THREADS": str(threads),
                "RAYON_NUM_THREADS": str(threads), "POLARS_TEMP_DIR": str(scratch)})
    return env


def benchmark(opts, engines, joins, limits, paths, sizes, skip_reason) -> dict:
    """Round-robin: for rep, for join, for limit, for engine. Returns runs per key.

    The engines' order turns at every (rep, join, limit) cell, so that each
    engine runs first in a cell, right after the previous cell's runs, equally often.
    A fixed order let the first engine always follow the previous cell's spilling
    runs; on a VM, memory first touched after gigabytes of spill I/O can cost a
    multiple in the kernel's page zeroing (measured: spilljoin unlimited SF10 inner
    1.71-1.74 s alone, 2.43-2.61 s right after a 5% run)."""
    env = child_env(opts.threads, DATA / "scratch")
    runs: dict[tuple, list] = {}
    cells = [(rep, j, l) for rep in range(opts.repeat) for j in joins for l in limits]
    # Turned by the cell's index and the rep, so a cell's order also changes from rep
    # to rep when the cells of one rep are a multiple of the engines.
    turns = [(k + rep) % len(engines) for k, (rep, _, _) in enumerate(cells)]
    todo = [(rep, j, l, e) for (rep, j, l), t in zip(cells, turns)
            for e in engines[t:] + engines[:t]]
    for i, (rep, join, limit_text, engine) in enumerate(todo, 1):
        key = (join, limit_text, engine)
        limit = parse_limit(limit_text, sizes[join]["bytes"])
        if engine in skip_reason:
            runs.setdefault(key, []).append({"status": "skipped", "error": skip_reason[engine]})
            continue
        if engine in NO_LIMIT_ENGINES and limit is not None:
            runs.setdefault(key, []).append({"status": "skipped", "error": "cannot limit memory"})
            continue
        r = run_one(engine, join, limit, opts, paths, env)
        runs.setdefault(key, []).append(r)
        what = (f"{r.get('time', 0):.2f} s, {mib(r['rss'])} MiB, rows {r.get('rows')}"
                if r["status"] == "ok" else r["error"])
        log(f"[{i}/{len(todo)}] rep {rep + 1} {join} {limit_text} {engine}: {what}")
    return runs


def paired_slowdowns(opts, joins, limits, paths, sizes) -> dict:
    """spilljoin's slowdown at each target limit (SLOWDOWN_TARGETS) from paired runs:
    per join and limit, `repeat` rounds of one unlimited and one limited run back to
    back, the order alternating from round to round (unlimited first in the first),
    after one unlimited run that is dropped. Returns {(join, limit): [(unlimited s,
    limited s), ...]}.

    On this VM the time of one configuration drifts by 1.5x within a sweep (SF10 inner
    unlimited 2.53-3.87 s; memory first touched right after gigabytes of spill I/O is
    zeroed several times slower), so a ratio of two medians taken minutes apart
    measures the VM as much as the join. A pair's two runs see the same machine, and
    alternating their order keeps either side from always running right after a
    spilling run (equally often for an even `repeat`; with 3, the unlimited run goes
    first twice); the verdict is the median of the pairs' ratios."""
    env = child_env(opts.threads, DATA / "scratch")
    out = {}
    targets = [l for l in limits if l.replace(" ", "") in SLOWDOWN_TARGETS]
    for join in joins:
        run_one("spilljoin", join, None, opts, paths, env)  # dropped: follows other runs
        for limit_text in targets:
            limit = parse_limit(limit_text, sizes[join]["bytes"])
            pairs = []
            for k in range(opts.repeat):
                order = [None, limit] if k % 2 == 0 else [limit, None]
                got = {l: run_one("spilljoin", join, l, opts, paths, env) for l in order}
                if all(r["status"] == "ok" for r in got.values()):
                    pairs.append((got[None]["time"], got[limit]["time"]))
            out[(join, limit_text)] = pairs
            log(f"paired, {join} {limit_text}: " + ", ".join(f"{u:.2f}/{t:.2f}" for u, t in pairs))
    return out


# ----------------------------------------------------------------------------- report

def summarize(runs: list) -> dict:
    ok = [r for r in runs if r["status"] == "ok"]
    errors = [r["error"] for r in runs if r["status"] != "ok"]
    s = {"n_ok": len(ok), "n": len(runs), "error": errors[0] if errors else None}
    if ok:
        s.update(time=statistics.median(r["time"] for r in ok),
                 wall=statistics.median(r["wall"] for r in ok),
                 cpu=statistics.median(r["cpu"] for r in ok),
                 rss=max(r["rss"] for r in ok), rows=ok[0].get("rows"),
                 results={json.dumps(r.get("result", r.get("rows"))) for r in ok})
        if ms := [r["metrics"] for r in ok if isinstance(r.get("metrics"), dict)]:
            med = lambda k: statistics.median(m.get(k, 0) for m in ms)
            s["metrics"] = {"build_bytes_spilled": med("build_bytes_spilled"),
                            "probe_bytes_spilled": med("probe_bytes_spilled"),
                            "max_recursion_depth": max(m.get("max_recursion_depth", 0) for m in ms),
                            "fallbacks": max(m.get("fallbacks", 0) for m in ms),
                            "memory_limit_bytes": ms[0].get("memory_limit_bytes")}
    elif rss := [r["rss"] for r in runs if r.get("rss") is not None]:
        s["rss"] = max(rss)  # how far a failed run got
    return s


def reference_results(runs: dict, joins) -> dict:
    """Per join, the most common full aggregate row among the SQL/DataFrame engines."""
    ref = {}
    for join in joins:
        votes = Counter(json.dumps(r["result"]) for (j, _, _), rs in runs.items() if j == join
                        for r in rs if "result" in r)
        ref[join] = json.loads(votes.most_common(1)[0][0]) if votes else None
    return ref


def check(s: dict, ref: list | None) -> str:
    if not s.get("results") or ref is None:
        return "-"
    got = [json.loads(x) for x in s["results"]]
    good = all(g == ref if isinstance(g, list) else g == ref[0] for g in got)
    return "ok" if good else "MISMATCH"


def rss_check(s: dict, limit: int | None) -> str:
    """Peak RSS within 1.1 x the limit + 64 MiB (headroom for code, runtime, I/O buffers)."""
    if limit is None or s.get("rss") is None:
        return "-"
    return "ok" if s["rss"] <= 1.1 * limit + 64 * 2**20 else "OVER"


def spill_columns(s: dict, limit: int | None, build_bytes: int) -> list[str]:
    """build MiB spilled, probe MiB spilled, depth, fallbacks, spill / hybrid minimum.

    The hybrid minimum is what does not fit, written once: build bytes - limit bytes.
    """
    m = s.get("metrics")
    if not m:
        return ["-"] * 5
    limit = m.get("memory_limit_bytes") if limit is not None else None
    need = None if limit is None else build_bytes - limit
    ratio = "-" if not need or need <= 0 else f"{m['build_bytes_spilled'] / max(1, need):.2f}"
    return [mib(m["build_bytes_spilled"]), mib(m["probe_bytes_spilled"]),
            str(m["max_recursion_depth"]), str(m["fallbacks"]), ratio]


def slowdown_summary(joins, limits, runs, paired: dict | None = None) -> list[str]:
    """Per join and limit: spilljoin's time / its unlimited time, against SLOWDOWN_TARGETS:
    the ratio of the sweep's medians and, where measured, the median of the paired runs'
    ratios (`paired_slowdowns`), which the verdict uses."""
    paired = paired or {}
    out = ["", "## spilljoin under a limit vs unlimited (--summary)", "",
           "Ratios of the sweep's medians, and the median (and range) of the ratios of "
           "paired runs made after it: per round one unlimited and one limited run back to "
           "back, in alternating order (see `paired_slowdowns` in run.py); the verdict uses "
           "the paired median.", "",
           "| join | limit | time s | unlimited s (sweep) | ratio | pairs: unlimited s, "
           "limited s (medians) | paired ratio (range) | target | verdict |", "|" + "---|" * 9]
    num = lambda x, fmt: "-" if x is None else format(x, fmt)
    times = lambda x: "-" if x is None else f"{x:.2f}×"
    for join in joins:
        base = summarize(runs.get((join, "none", "spilljoin"), [])).get("time")
        for limit_text in (l for l in limits if l.lower() != "none"):
            s = summarize(runs.get((join, limit_text, "spilljoin"), []))
            t = s.get("time")
            target = SLOWDOWN_TARGETS.get(limit_text.replace(" ", ""))
            ratio = t / base if t is not None and base else None
            pairs = paired.get((join, limit_text), [])
            ratios = [lt / u for u, lt in pairs if u > 0]
            pr = statistics.median(ratios) if ratios else None
            pair_times = (f"{statistics.median(u for u, _ in pairs):.2f}, "
                          f"{statistics.median(lt for _, lt in pairs):.2f}" if pairs else "-")
            pr_text = (f"{pr:.2f}× ({min(ratios):.2f}–{max(ratios):.2f}, {len(ratios)} pairs)"
                       if ratios else "-")
            judged = pr if pr is not None else ratio
            if pr is None and ratio is not None and target is not None:
                pr_text = "- (verdict from the sweep's ratio)"
            verdict = ("FAILED" if s["n"] and not s["n_ok"] and target is not None
                       else "-" if judged is None or target is None
                       else "met" if judged <= target else "MISSED")
            out.append(f"| {join} | {limit_text} | {num(t, '.2f')} | {num(base, '.2f')} "
                       f"| {times(ratio)} | {pair_times} | {pr_text} "
                       f"| {'≤ %g×' % target if target else '-'} | {verdict} |")
    if not any(l.lower() == "none" for l in limits):
        out += ["", "No `none` limit in this run, so no unlimited time to divide by."]
    return out


def status_text(s: dict) -> str:
    if s["n_ok"] == s["n"]:
        return "ok"
    err = (s["error"] or "").replace("|", "/")
    return err if s["n_ok"] == 0 else f"ok {s['n_ok']}/{s['n']}; {err}"


def report(opts, argv, engines, joins, limits, sizes, runs, env_info, baselines,
           summary: bool = False, skew_info: dict | None = None,
           paired: dict | None = None) -> str:
    ref = reference_results(runs, joins)
    out = ["# spilljoin vs peer engines: TPC-H joins", "",
           f"- command: `{shlex.join(argv)}`", f"- date: {env_info['date']}",
           f"- machine: nproc {env_info['nproc']}, {env_info['cpu']}, {env_info['mem']} RAM, "
           f"load average {env_info['load_start']} at start, {os.getloadavg()[0]:.2f} at end",
           f"- versions: {env_info['versions']}",
           f"- SF {opts.sf:g}, threads {opts.threads}, repeat {opts.repeat}, timeout {opts.timeout:g} s",
           "- time = median in-engine time of the ok runs (query only, no interpreter start-up); "
           "wall = median child process wall time; RSS = max peak RSS of the child "
           f"(python engines include their import baseline: {baselines}); "
           + ("RSS and cpu measured by GNU time" if GNU_TIME else
              f"RSS from wait4, never below this script's own peak of {mib(own_peak_rss())} MiB"),
           "",
           "## Build sides (limits in % are shares of these bytes)", "",
           "| join | build side | columns | rows | Arrow MiB |", "|---|---|---|---|---|"]
    for j in joins:
        b = sizes[j]
        out.append(f"| {j} | {b['table']} | {', '.join(b['columns'] or ['(all)'])} | {b['rows']} | {mib(b['bytes'])} |")
    out += ["", "## Results", "",
            "Limits in % are shares of the build side's projected Arrow bytes above. "
            "RSS check: `ok` when peak RSS ≤ 1.1 × limit + 64 MiB, else `OVER` (python engines' "
            "RSS includes their import baseline). Spill columns are spilljoin's `--metrics` "
            "(bytes: medians over the ok runs; depth, fallbacks: maxima); spill / hybrid min = "
            "build bytes spilled / (build Arrow bytes − limit), `-` when the build side fits.", "",
            "| join | limit | limit MiB | engine | status | time s | ×spilljoin | wall s | cpu s "
            "| peak RSS MiB | RSS ≤ 1.1×limit+64 MiB | rows | check | build MiB spilled "
            "| probe MiB spilled | depth | fallbacks | spill / hybrid min |", "|" + "---|" * 18]
    for join in joins:
        for limit_text in limits:
            limit = parse_limit(limit_text, sizes[join]["bytes"])
            sj = summarize(runs.get((join, limit_text, "spilljoin"), []))
            for engine in engines:
                s = summarize(runs[(join, limit_text, engine)])
                t = s.get("time")
                ratio = f"{t / sj['time']:.2f}" if t and sj.get("time") else "-"
                f = lambda k: f"{s[k]:.2f}" if s.get(k) is not None else "-"
                out.append(f"| {join} | {limit_text} | {mib(limit)} | {engine} | {status_text(s)} "
                           f"| {f('time')} | {ratio} | {f('wall')} | {f('cpu')} | {mib(s.get('rss'))} "
                           f"| {rss_check(s, limit)} | {s.get('rows', '-')} | {check(s, ref[join])} | "
                           + " | ".join(spill_columns(s, limit, sizes[join]["bytes"])) + " |")
    if summary:
        out += slowdown_summary(joins, limits, runs, paired)
    out += ["", "## Reference results ([count, sum of left column, sum of right column])", ""]
    out += [f"- {j}: `{json.dumps(ref[j])}` — `{JOINS[j].sql}`" for j in joins]
    if skew_info:
        out += ["", "## Skew dataset", "",
                f"- seed {skew_info['seed']}, zipf a = {skew_info['zipf_a']}; hot key "
                f"{skew_info['hot_key']}: {skew_info['hot_build_rows']} of {skew_info['build_rows']} "
                f"orders_skew rows, {skew_info['hot_probe_rows']} of {skew_info['probe_rows']} "
                "lineitem_skew rows",
                f"- distinct keys: {skew_info['build_distinct_keys']} (orders_skew), "
                f"{skew_info['probe_distinct_keys']} (lineitem_skew); "
                f"{skew_info['probe_rows_matching']} lineitem_skew rows have a match",
                "- heaviest build keys [key, build rows, probe rows]: "
                f"`{json.dumps(skew_info['top_build_keys'])}`; heaviest probe keys: "
                f"`{json.dumps(skew_info['top_probe_keys'])}`",
                f"- expected skew_inner output (from data prep): {skew_info['expected_inner_rows']} rows"
                + ("" if ref.get("skew_inner") is None else
                   " — " + ("agrees with" if ref["skew_inner"][0] == skew_info["expected_inner_rows"]
                            else "**differs from**") + " the reference count")]
    return "\n".join(out) + "\n"


def environment(engines) -> dict:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.processor())
    mem = next((int(l.split()[1]) * 1024 for l in open("/proc/meminfo")
                if l.startswith("MemTotal")), 0)
    versions = []
    for pkg in ("duckdb", "datafusion", "polars", "pyarrow", "numpy", "tpchgen-cli"):
        try:
            versions.append(f"{pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            pass
    if "spilljoin" in engines:
        rev = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO,
                             capture_output=True, text=True).stdout.strip() or "no commit"
        versions.insert(0, f"spilljoin {rev}")
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "nproc": os.cpu_count(), "cpu": cpu, "mem": f"{mem / 2**30:.1f} GiB",
            "load_start": f"{os.getloadavg()[0]:.2f}", "versions": ", ".join(versions)}


def import_baselines(engines, opts, paths) -> str:
    """Peak RSS of a child that only imports the engine's module."""
    env = child_env(opts.threads, DATA / "scratch")
    parts = []
    for module in dict.fromkeys(PY_MODULE[e] for e in engines if e in PY_MODULE):
        engine = next(e for e in engines if PY_MODULE.get(e) == module)
        r = run_one(engine, next(iter(JOINS)), None, opts, paths, env, import_only=True)
        parts.append(f"{module} {mib(r['rss'])} MiB")
    return ", ".join(parts) or "-"


def own_peak_rss() -> int:
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status")
                if l.startswith("VmHWM"))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sf", type=float, default=1, help="TPC-H scale factor (default 1)")
    p.add_argument("--engines", default=DEFAULT_ENGINES,
                   help=f"comma list of {', '.join(ENGINES)}; 'datafusion' = -hj and -smj")
    p.add_argument("--joins", default="all", help=f"'all' or comma list of {', '.join(JOINS)}")
    p.add_argument("--memory-limits", default="none,50%,25%,10%,5%",
                   help="comma list: none, N%% of the build side, or bytes like 64MiB")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600, help="kill a run after this many s")
    p.add_argument("--out", help="also write the Markdown here (default data/results-sfN.md)")
    p.add_argument("--rebuild", action="store_true", help="run cargo build even if the binary exists")
    p.add_argument("--skew", action="store_true",
                   help="write the skew dataset (orders_skew, lineitem_skew) and run skew_inner too")
    p.add_argument("--summary", action="store_true",
                   help="after the table, spilljoin's time under each limit / its unlimited time "
                        "(in the sweep, and from repeat pairs of unlimited and limited runs per join and "
                        "target limit, made after it)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--prepare", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    opts = parse_args(argv)
    if opts.child:
        return child_main(json.loads(opts.child))
    if opts.prepare:
        return prepare(**json.loads(opts.prepare))
    engines = [x for e in opts.engines.split(",") for x in ENGINE_ALIASES.get(e.strip(), (e.strip(),))]
    joins = ([j for j in JOINS if j not in SKEW_JOINS] if opts.joins == "all"
             else [j.strip() for j in opts.joins.split(",")])
    if opts.skew:
        joins += [j for j in SKEW_JOINS if j not in joins]
    skew = any(j in SKEW_JOINS for j in joins)  # naming skew_inner implies --skew
    limits = [l.strip() for l in opts.memory_limits.split(",")]
    for name, allowed in (("engine", ENGINES), ("join", JOINS)):
        bad = [x for x in (engines if name == "engine" else joins) if x not in allowed]
        if bad:
            raise SystemExit(f"unknown {name}(s) {bad}; choose from {', '.join(allowed)}")

    env_info = environment(engines)
    # Data preparation reads Parquet with pyarrow: do it in a child so that this
    # process stays small (a child's peak RSS starts from its parent's at fork).
    filtered = "spilljoin" in engines and any(JOINS[j].right_filter for j in joins)
    prep = {"sf": opts.sf, "threads": opts.threads, "filtered": filtered, "skew": skew}
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--prepare", json.dumps(prep)],
                   check=True)
    paths = table_paths(opts.sf)
    sizes = json.loads((sf_dir(opts.sf) / "build_sizes.json").read_text())
    skip = {}
    if "spilljoin" in engines:
        reason = ensure_spilljoin(opts.rebuild, opts.threads)
        if reason:
            log(f"spilljoin skipped: {reason}")
            skip["spilljoin"] = reason
    baselines = import_baselines(engines, opts, paths)
    runs = benchmark(opts, engines, joins, limits, paths, sizes, skip)
    paired = (paired_slowdowns(opts, joins, limits, paths, sizes)
              if opts.summary and "spilljoin" in engines and "spilljoin" not in skip
              and any(l.lower() == "none" for l in limits) else None)
    skew_file = sf_dir(opts.sf) / "skew.json"
    skew_info = json.loads(skew_file.read_text()) if skew and skew_file.exists() else None
    md = report(opts, ["python3", "benches/compare/run.py", *argv], engines, joins, limits,
                sizes, runs, env_info, baselines, summary=opts.summary, skew_info=skew_info,
                paired=paired)
    print(md)
    # A run of skewed joins only gets a file of its own: run after the main sweep at
    # the same scale factor, it overwrote that sweep's results.
    only_skew = all(j in SKEW_JOINS for j in joins)
    default = f"results-sf{opts.sf:g}{'-skew' if only_skew else ''}.md"
    out = Path(opts.out) if opts.out else DATA / default
    out.write_text(md)
    raw = {" / ".join(k): v for k, v in runs.items()}
    raw.update({f"{j} / {l} / spilljoin / paired (unlimited, limited)": v
                for (j, l), v in (paired or {}).items()})
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    log(f"wrote {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main(sys.argv[1:])
