#!/usr/bin/env python3
"""Wide-row inputs for the peak-RSS check of output rows of 1-2 KB.

    python3 benches/compare/wide.py OUT_DIR COLUMNS [ROWS]

Writes OUT_DIR/left.parquet and OUT_DIR/right.parquet: ROWS rows each (default
400,000), key `k` (0..ROWS, shuffled, unique: every row matches one) and COLUMNS
string columns of 60-70 random bytes (`l0..`, `r0..`), in row groups of 65,536 (pyarrow's
defaults otherwise: dictionary pages where they pay, snappy). An inner join's output
row is about 2 × COLUMNS × 65 bytes: 8 columns make rows of ~1 KB, 16 of ~2 KB.
Seeded, so that every run writes the same files.
"""
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", np.uint8)


def strings(rng: np.random.Generator, rows: int) -> pa.Array:
    lengths = rng.integers(60, 71, rows)
    offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = ALPHABET[rng.integers(0, len(ALPHABET), int(offsets[-1]))]
    return pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(data.tobytes()))


def side(rng: np.random.Generator, prefix: str, columns: int, rows: int) -> pa.Table:
    keys = rng.permutation(rows).astype(np.int64)
    cols = {"k": pa.array(keys)}
    cols.update({f"{prefix}{i}": strings(rng, rows) for i in range(columns)})
    return pa.table(cols)


def main() -> None:
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    out, columns = Path(sys.argv[1]), int(sys.argv[2])
    rows = int(sys.argv[3]) if len(sys.argv) == 4 else 400_000
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(27)
    for name, prefix in (("left", "l"), ("right", "r")):
        pq.write_table(side(rng, prefix, columns, rows), out / f"{name}.parquet", row_group_size=65_536)


if __name__ == "__main__":
    main()
