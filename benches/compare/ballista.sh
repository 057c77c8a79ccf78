#!/bin/bash
# usage: benches/compare/ballista.sh EXECUTORS MEMORY QUERY_NUM [spilljoin|stock]
# Starts a scheduler and EXECUTORS executor processes (each with MEMORY and its own
# spill dir), runs TPC-H SF10 query QUERY_NUM with spilljoin's joins or DataFusion's
# (stock: spilljoin.enabled=false in the client's session), prints wall, per-executor
# peak RSS and peak spill-dir bytes.
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
N=$1; MEM=$2; Q=$3; MODE=${4:-spilljoin}
SETTINGS=()
[ "$MODE" = stock ] && SETTINGS=(--set spilljoin.enabled=false)
BIN=$ROOT/target/release/examples/cluster  # cargo build --release -p spilljoin-ballista --example cluster
D=${TPCH_DIR:-$ROOT/benches/compare/data/tpch-sf10}  # one Parquet file a table
W=$(mktemp -d /tmp/bfig.XXXX)
$BIN scheduler --partitions 2 > $W/sched.out 2> $W/sched.err &
SP=$!
for i in $(seq 1 50); do [ -s $W/sched.out ] && break; sleep 0.1; done
ADDR=$(head -1 $W/sched.out)
EPIDS=()
for e in $(seq 1 $N); do
  mkdir -p $W/e$e
  /usr/bin/time -f "%M" -o $W/rss$e $BIN executor --scheduler $ADDR --executor-memory $MEM --spill-dir $W/e$e --partitions 2 > /dev/null 2> $W/exec$e.err &
  EPIDS+=($!)
done
sleep 2
( while true; do for e in $(seq 1 $N); do du -sb $W/e$e 2>/dev/null | cut -f1 >> $W/du$e; done; sleep 0.5; done ) &
DUP=$!
TABLES=""
for t in customer lineitem nation orders part partsupp region supplier; do TABLES="$TABLES --table $t=$D/$t.parquet"; done
SQL=$(grep -v "^--" $ROOT/datafusion/tests/tpch/q$Q.sql)
START=$(date +%s.%N)
timeout 1200 $BIN sql --scheduler $ADDR "${SETTINGS[@]}" $TABLES "$SQL" > $W/out 2> $W/err
RC=$?
END=$(date +%s.%N)
kill $DUP 2>/dev/null
for p in ${EPIDS[@]}; do c=$(pgrep -P $p); grep VmHWM /proc/$c/status 2>/dev/null | awk -v p=$p "{print \$2}" > $W/hwm$p; done
for p in ${EPIDS[@]}; do kill -INT $(pgrep -P $p) 2>/dev/null; done
kill $SP 2>/dev/null
sleep 1
echo "Q$Q $MODE executors=$N mem=$MEM rc=$RC wall=$(echo "$END - $START" | bc)"
for e in $(seq 1 $N); do echo "  executor $e: peak RSS $(cat $W/hwm${EPIDS[$((e-1))]} 2>/dev/null) KB, peak spill dir $(sort -n $W/du$e | tail -1) B"; done
tail -3 $W/err
