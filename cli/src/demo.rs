//! `spilljoin demo`: TPC-H-shaped data made on the spot, joined under a limit.
//!
//! `orders(o_orderkey, o_custkey, o_totalprice, o_orderdate, o_comment)` and
//! `lineitem(l_orderkey, l_linenumber, l_quantity, l_extendedprice, l_shipmode)` with
//! one to seven line items per order, written as Parquet and joined with
//! `lineitem ⋈ orders` on the order key (orders builds), as `spilljoin join` would,
//! under an 8 MiB memory limit unless `--memory-limit` says otherwise.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow_array::{
    ArrayRef, Date32Array, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use spilljoin::{JoinType, NullEquality, Side};

use super::args::DemoArgs;
use super::format::{CsvOptions, Format};
use super::input::{Input, InputOptions};
use super::output::OutputSpec;
use super::plan::{JoinRequest, Plan};
use super::signals::Interrupt;

/// A small deterministic generator (splitmix64): the demo's data is the same on
/// every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const SHIP_MODES: [&str; 7] = ["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"];
const WORDS: [&str; 8] = [
    "quick", "final", "pending", "ironic", "express", "regular", "bold", "careful",
];

/// Runs the demo.
pub fn run(args: &DemoArgs, interrupt: &Interrupt) -> Result<()> {
    let temp;
    let dir = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            dir.clone()
        }
        None => {
            temp = tempfile::tempdir().context("cannot create a temp dir for the demo data")?;
            temp.path().to_path_buf()
        }
    };
    let (orders, lineitem) = (dir.join("orders.parquet"), dir.join("lineitem.parquet"));
    let line_rows = generate(&orders, &lineitem, args.orders)?;
    let quiet = args.run.quiet;
    if !quiet {
        eprintln!(
            "demo: {} orders and {line_rows} line items in {}",
            args.orders,
            dir.display()
        );
    }
    // Unless told otherwise, the demo runs under a limit well below the build side's
    // size, so that it spills and shows it.
    let mut run = args.run.clone();
    let limit = run.memory_limit.unwrap_or(DEMO_MEMORY_LIMIT_BYTES);
    run.memory_limit = Some(limit);
    if !quiet {
        eprintln!(
            "demo: spilljoin join --left {} --right {} --on l_orderkey=o_orderkey --memory-limit {limit}",
            lineitem.display(),
            orders.display()
        );
    }
    let options = InputOptions {
        format: Some(Format::Parquet),
        schema_override: None,
        csv: CsvOptions {
            delimiter: None,
            header: true,
        },
        infer_rows: 1,
    };
    let plan = Plan::new(JoinRequest {
        left: Input::open(Side::Left, &lineitem.to_string_lossy(), &options)?,
        right: Input::open(Side::Right, &orders.to_string_lossy(), &options)?,
        on: vec![("l_orderkey".into(), "o_orderkey".into())],
        join_type: JoinType::Inner,
        null_equality: NullEquality::NullEqualsNothing,
        select: None,
        filter: None,
        output: OutputSpec::new(None, None, None, options.csv)?,
        swap: true,
        pushdown: crate::pushdown::PushdownMode::default(),
        run,
    })?;
    super::run::execute(&plan, interrupt)
}

/// The demo's default memory limit: 8 MiB, a fraction of the default 300 000 orders.
const DEMO_MEMORY_LIMIT_BYTES: u64 = 8 << 20;

/// Writes `orders` orders and their line items as Parquet, a chunk of orders at a
/// time; returns the number of line items.
fn generate(orders_path: &Path, lineitem_path: &Path, orders: usize) -> Result<usize> {
    const CHUNK: usize = 65_536;
    let (orders_schema, lineitem_schema) = (orders_schema(), lineitem_schema());
    let create =
        |p: &Path| File::create(p).with_context(|| format!("cannot create {}", p.display()));
    let mut ow = ArrowWriter::try_new(create(orders_path)?, Arc::clone(&orders_schema), None)?;
    let mut lw = ArrowWriter::try_new(create(lineitem_path)?, Arc::clone(&lineitem_schema), None)?;
    let mut rng = SplitMix(42);
    let mut line_rows = 0;
    for start in (0..orders).step_by(CHUNK) {
        let end = (start + CHUNK).min(orders);
        let mut chunk = Chunk::default();
        for o in start..end {
            chunk.push_order(&mut rng, o, orders);
        }
        line_rows += chunk.l_orderkey.len();
        let (order_columns, line_columns) = chunk.into_columns();
        ow.write(&RecordBatch::try_new(
            Arc::clone(&orders_schema),
            order_columns,
        )?)?;
        lw.write(&RecordBatch::try_new(
            Arc::clone(&lineitem_schema),
            line_columns,
        )?)?;
    }
    ow.close()?;
    lw.close()?;
    Ok(line_rows)
}

fn orders_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("o_orderkey", DataType::Int64, false),
        Field::new("o_custkey", DataType::Int64, false),
        Field::new("o_totalprice", DataType::Float64, false),
        Field::new("o_orderdate", DataType::Date32, false),
        Field::new("o_comment", DataType::Utf8, false),
    ]))
}

fn lineitem_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("l_orderkey", DataType::Int64, false),
        Field::new("l_linenumber", DataType::Int32, false),
        Field::new("l_quantity", DataType::Float64, false),
        Field::new("l_extendedprice", DataType::Float64, false),
        Field::new("l_shipmode", DataType::Utf8, false),
    ]))
}

/// One chunk of orders and their line items, column by column.
#[derive(Default)]
struct Chunk {
    o_orderkey: Vec<i64>,
    o_custkey: Vec<i64>,
    o_totalprice: Vec<f64>,
    o_orderdate: Vec<i32>,
    o_comment: Vec<String>,
    l_orderkey: Vec<i64>,
    l_linenumber: Vec<i32>,
    l_quantity: Vec<f64>,
    l_extendedprice: Vec<f64>,
    l_shipmode: Vec<&'static str>,
}

impl Chunk {
    /// Adds order number `o` (from 0) of `orders`, and its one to seven line items.
    fn push_order(&mut self, rng: &mut SplitMix, o: usize, orders: usize) {
        // TPC-H order keys are sparse: 8 of every 32 values are used.
        let key = ((o / 8) * 32 + o % 8 + 1) as i64;
        self.o_orderkey.push(key);
        self.o_custkey
            .push(rng.below(orders as u64 / 10 + 1) as i64 + 1);
        self.o_totalprice.push(rng.below(50_000_000) as f64 / 100.0);
        self.o_orderdate.push(8035 + rng.below(2400) as i32);
        self.o_comment.push(format!(
            "{} {} requests",
            WORDS[rng.below(8) as usize],
            WORDS[rng.below(8) as usize]
        ));
        for line in 1..=(1 + rng.below(7)) as i32 {
            self.l_orderkey.push(key);
            self.l_linenumber.push(line);
            self.l_quantity.push((1 + rng.below(50)) as f64);
            self.l_extendedprice
                .push(rng.below(10_000_000) as f64 / 100.0);
            self.l_shipmode.push(SHIP_MODES[rng.below(7) as usize]);
        }
    }

    /// The orders' columns and the line items' columns, in their schemas' order.
    fn into_columns(self) -> (Vec<ArrayRef>, Vec<ArrayRef>) {
        let orders: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(self.o_orderkey)),
            Arc::new(Int64Array::from(self.o_custkey)),
            Arc::new(Float64Array::from(self.o_totalprice)),
            Arc::new(Date32Array::from(self.o_orderdate)),
            Arc::new(StringArray::from(self.o_comment)),
        ];
        let lineitem: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(self.l_orderkey)),
            Arc::new(Int32Array::from(self.l_linenumber)),
            Arc::new(Float64Array::from(self.l_quantity)),
            Arc::new(Float64Array::from(self.l_extendedprice)),
            Arc::new(StringArray::from(self.l_shipmode)),
        ];
        (orders, lineitem)
    }
}
