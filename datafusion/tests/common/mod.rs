//! What tests/tpch.rs, tests/sql_joins.rs and the Ballista crate's cluster test
//! share: sessions with and without the rule, a query run that records which joins
//! its physical plan holds, answers as canonical rows, the generated data (TPC-H
//! tables, seeded random tables) and the TPC-H query texts.
//!
//! Every test compares a session WITH `SpilljoinRule` against stock DataFusion
//! WITHOUT it and without a memory limit (the reference): same rows, as a multiset
//! unless the query's ORDER BY fixes the order. Floats are compared at 9 significant
//! digits, since aggregates over a join's output add in the order the join emits.
#![allow(dead_code)] // each test file uses its own part of this module

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, Float32Array, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::{FairSpillPool, GreedyMemoryPool, MemoryPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_plan::{collect, displayable, ExecutionPlan};
use datafusion::prelude::{SessionConfig, SessionContext};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The memory pool of a session.
#[derive(Debug, Clone, Copy)]
pub enum Pool {
    /// No limit (DataFusion's default unbounded pool).
    Unlimited,
    /// A `FairSpillPool` of this many bytes.
    Fair(usize),
    /// A `GreedyMemoryPool` of this many bytes.
    Greedy(usize),
}

/// How a session is set up.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Whether `with_spilljoin` installs the rule.
    pub rule: bool,
    /// The memory pool.
    pub pool: Pool,
    /// DataFusion's target partitions.
    pub target_partitions: usize,
    /// Further `SET`s, by name.
    pub settings: Vec<(String, String)>,
}

impl Setup {
    /// Stock DataFusion, no rule, no limit, 2 target partitions: the reference.
    pub fn stock() -> Self {
        Self {
            rule: false,
            pool: Pool::Unlimited,
            target_partitions: 2,
            settings: Vec::new(),
        }
    }

    /// The same with the rule installed, replacing every `HashJoinExec` (those
    /// `CollectLeft` joins with a small build too, which the default leaves).
    pub fn spilljoin() -> Self {
        Self {
            rule: true,
            ..Self::stock()
        }
        .set("spilljoin.prepared_collect_left_min_bytes", "0")
    }

    /// Forces spilling: every build partition spills, and again two levels down.
    pub fn force_spill(self) -> Self {
        self.set("spilljoin.force_spill", "1")
            .set("spilljoin.force_spill_depth", "2")
    }

    /// With memory pool `pool`.
    pub fn pool(mut self, pool: Pool) -> Self {
        self.pool = pool;
        self
    }

    /// With setting `key` at `value`.
    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.settings.push((key.to_owned(), value.to_owned()));
        self
    }

    /// A session set up so, with `tables` registered.
    pub fn context(&self, tables: &[Table]) -> SessionContext {
        let mut config = SessionConfig::new().with_target_partitions(self.target_partitions);
        if self.rule {
            config = spilljoin_datafusion::with_spilljoin_config(config);
        }
        for (key, value) in &self.settings {
            config.options_mut().set(key, value).unwrap();
        }
        let mut runtime = RuntimeEnvBuilder::new();
        let pool: Option<Arc<dyn MemoryPool>> = match self.pool {
            Pool::Unlimited => None,
            Pool::Fair(bytes) => Some(Arc::new(FairSpillPool::new(bytes))),
            Pool::Greedy(bytes) => Some(Arc::new(GreedyMemoryPool::new(bytes))),
        };
        if let Some(pool) = pool {
            runtime = runtime.with_memory_pool(pool);
        }
        let mut state = SessionStateBuilder::new()
            .with_default_features()
            .with_config(config)
            .with_runtime_env(runtime.build_arc().unwrap());
        if self.rule {
            state = spilljoin_datafusion::with_spilljoin(state);
        }
        let ctx = SessionContext::new_with_state(state.build());
        for table in tables {
            let mem = MemTable::try_new(Arc::clone(&table.schema), table.partitions.clone());
            ctx.register_table(table.name.as_str(), Arc::new(mem.unwrap()))
                .unwrap();
        }
        ctx
    }
}

/// A table to register: its batches, by partition.
#[derive(Debug, Clone)]
pub struct Table {
    /// The name queries use.
    pub name: String,
    /// Its schema.
    pub schema: SchemaRef,
    /// Its batches, one list per partition.
    pub partitions: Vec<Vec<RecordBatch>>,
}

impl Table {
    /// `batches` as a table of `partitions` partitions: the rows cut into batches of
    /// the sizes in `batch_rows` (cycling), dealt to the partitions in turn.
    pub fn split(
        name: &str,
        schema: SchemaRef,
        batches: &[RecordBatch],
        partitions: usize,
        batch_rows: &[usize],
    ) -> Self {
        let all = concat_batches(&schema, batches).unwrap();
        let mut parts = vec![Vec::new(); partitions];
        let (mut offset, mut i) = (0, 0);
        while offset < all.num_rows() {
            let len = batch_rows[i % batch_rows.len()].min(all.num_rows() - offset);
            parts[i % partitions].push(all.slice(offset, len));
            offset += len;
            i += 1;
        }
        Self {
            name: name.to_owned(),
            schema,
            partitions: parts,
        }
    }

    /// The rows of the table.
    pub fn num_rows(&self) -> usize {
        self.partitions.iter().flatten().map(|b| b.num_rows()).sum()
    }
}

/// The joins of a physical plan, by operator, each as its one-line display.
#[derive(Debug, Clone, Default)]
pub struct Joins {
    /// `SpilljoinExec`s.
    pub spilljoin: Vec<String>,
    /// `HashJoinExec`s (what the rule did not replace).
    pub hash: Vec<String>,
    /// Every other join operator (nested loop, cross, sort-merge, ...).
    pub other: Vec<String>,
}

impl Joins {
    /// The joins of `plan` and its descendants.
    pub fn of(plan: &Arc<dyn ExecutionPlan>) -> Self {
        let mut joins = Self::default();
        joins.walk(plan);
        joins
    }

    fn walk(&mut self, plan: &Arc<dyn ExecutionPlan>) {
        let line = displayable(plan.as_ref()).one_line().to_string();
        let line = line.trim_end().to_owned();
        match plan.name() {
            "SpilljoinExec" => self.spilljoin.push(line),
            "HashJoinExec" => self.hash.push(line),
            name if name.contains("Join") => self.other.push(line),
            _ => {}
        }
        for child in plan.children() {
            self.walk(child);
        }
    }

    /// Every join's line, for messages.
    pub fn all(&self) -> Vec<&String> {
        self.spilljoin
            .iter()
            .chain(&self.hash)
            .chain(&self.other)
            .collect()
    }
}

/// What a query returned and how it was planned.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The rows in output order, canonical (see [`canonical_rows`]).
    pub rows: Vec<String>,
    /// The joins of the physical plan that ran.
    pub joins: Joins,
}

/// Plans `sql` in `ctx`, walks the physical plan for its joins and runs that plan.
///
/// # Errors
/// The planner's or the execution's error.
pub async fn run(ctx: &SessionContext, sql: &str) -> Result<Outcome, DataFusionError> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let joins = Joins::of(&plan);
    let batches = collect(plan, ctx.task_ctx()).await?;
    Ok(Outcome {
        rows: canonical_rows(&batches),
        joins,
    })
}

/// The `EXPLAIN` text (physical plan) of `sql` in `ctx`.
pub async fn explain(ctx: &SessionContext, sql: &str) -> String {
    let batches = ctx
        .sql(&format!("EXPLAIN {sql}"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut text = String::new();
    for batch in &batches {
        let column = batch
            .column_by_name("plan")
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        for value in column.iter().flatten() {
            text.push_str(value);
            text.push('\n');
        }
    }
    text
}

/// Each row as one string: its values joined by " | ", nulls as NULL, floats at 9
/// significant digits.
pub fn canonical_rows(batches: &[RecordBatch]) -> Vec<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for batch in batches {
        let columns: Vec<Box<dyn Fn(usize) -> String>> = batch
            .columns()
            .iter()
            .map(|column| cell_formatter(column, &options))
            .collect();
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = columns.iter().map(|f| f(row)).collect();
            rows.push(cells.join(" | "));
        }
    }
    rows
}

fn cell_formatter<'a>(
    column: &'a ArrayRef,
    options: &'a FormatOptions<'a>,
) -> Box<dyn Fn(usize) -> String + 'a> {
    // -0.0 and 0.0 print alike; finite values at 9 significant digits.
    let float = |v: f64| {
        if v == 0.0 {
            "0".to_owned()
        } else if v.is_finite() {
            format!("{v:.8e}")
        } else {
            v.to_string()
        }
    };
    match column.data_type() {
        DataType::Float64 => {
            let array = column.as_any().downcast_ref::<Float64Array>().unwrap();
            Box::new(move |row| match array.is_null(row) {
                true => "NULL".to_owned(),
                false => float(array.value(row)),
            })
        }
        DataType::Float32 => {
            let array = column.as_any().downcast_ref::<Float32Array>().unwrap();
            Box::new(move |row| match array.is_null(row) {
                true => "NULL".to_owned(),
                false => float(f64::from(array.value(row))),
            })
        }
        _ => {
            let formatter = ArrayFormatter::try_new(column.as_ref(), options).unwrap();
            Box::new(move |row| formatter.value(row).to_string())
        }
    }
}

/// How `got` differs from `reference`, or `None` when they are the same rows (in
/// the same order when `ordered`).
pub fn difference(reference: &[String], got: &[String], ordered: bool) -> Option<String> {
    if ordered && reference == got {
        return None;
    }
    let (mut want, mut have) = (reference.to_vec(), got.to_vec());
    want.sort();
    have.sort();
    if want == have {
        return match ordered {
            true => Some(format!(
                "same {} rows in another order; first rows: reference {:?}, got {:?}",
                want.len(),
                &reference[..reference.len().min(3)],
                &got[..got.len().min(3)]
            )),
            false => None,
        };
    }
    let (missing, extra) = multiset_minus(&want, &have);
    Some(format!(
        "{} rows expected, {} returned; {} missing (first: {:?}), {} extra (first: {:?})",
        want.len(),
        have.len(),
        missing.len(),
        &missing[..missing.len().min(3)],
        extra.len(),
        &extra[..extra.len().min(3)]
    ))
}

/// The rows of sorted `a` not in sorted `b` and those of `b` not in `a`.
fn multiset_minus<'a>(a: &'a [String], b: &'a [String]) -> (Vec<&'a String>, Vec<&'a String>) {
    let (mut i, mut j) = (0, 0);
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    while i < a.len() || j < b.len() {
        if j == b.len() || (i < a.len() && a[i] < b[j]) {
            only_a.push(&a[i]);
            i += 1;
        } else if i == a.len() || b[j] < a[i] {
            only_b.push(&b[j]);
            j += 1;
        } else {
            i += 1;
            j += 1;
        }
    }
    (only_a, only_b)
}

/// The memory consumer a "Resources exhausted" error names as the one that failed
/// to allocate ("Failed to allocate additional 1 MB for NAME with ..."), or the
/// operator that refused on its own ("SpilljoinExec: ..."), if it names one.
pub fn failing_consumer(error: &DataFusionError) -> Option<String> {
    let text = error.to_string();
    if let Some(at) = text.find("Failed to allocate additional ") {
        let rest = &text[at..];
        let start = rest.find(" for ")? + " for ".len();
        let end = rest[start..].find(" with ")? + start;
        return Some(rest[start..end].to_owned());
    }
    text.contains("SpilljoinExec")
        .then(|| "SpilljoinExec".to_owned())
}

/// Whether `consumer` (see [`failing_consumer`]) is a join's.
pub fn is_join_consumer(consumer: &str) -> bool {
    consumer.starts_with("HashJoinInput")
        || consumer.starts_with("SpilljoinExec")
        || consumer.contains("Join")
}

/// The distribution of a random table's join key `k`.
#[derive(Debug, Clone, Copy)]
pub struct Keys {
    /// Keys are drawn from `first..first + distinct`.
    pub first: i64,
    /// See `first`.
    pub distinct: i64,
    /// The share of rows whose key is the hot key `first` (skew).
    pub hot: f64,
    /// The share of rows whose key is NULL.
    pub nulls: f64,
}

/// A seeded random table `name` of `rows` rows in `partitions` partitions:
/// `id` (unique), `k` (see `keys`), `k2` (0 to 3, 5 % NULL), `v` (0 to 99, 5 %
/// NULL), `s` (`s<k mod 40>`, NULL where `k` is), in batches of odd sizes.
pub fn random_table(name: &str, rows: usize, partitions: usize, seed: u64, keys: Keys) -> Table {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut k = Vec::with_capacity(rows);
    let mut k2 = Vec::with_capacity(rows);
    let mut v = Vec::with_capacity(rows);
    for _ in 0..rows {
        let key = match rng.random::<f64>() {
            x if x < keys.nulls => None,
            x if x < keys.nulls + keys.hot => Some(keys.first),
            _ => Some(keys.first + rng.random_range(0..keys.distinct)),
        };
        k.push(key);
        k2.push((!rng.random_bool(0.05)).then(|| rng.random_range(0..4)));
        v.push((!rng.random_bool(0.05)).then(|| rng.random_range(0..100)));
    }
    let s: Vec<Option<String>> = k
        .iter()
        .map(|key| key.map(|key| format!("s{}", key.rem_euclid(40))))
        .collect();
    let schema = random_schema();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(0..rows as i64)),
        Arc::new(Int64Array::from(k)),
        Arc::new(Int32Array::from(k2)),
        Arc::new(Int64Array::from(v)),
        Arc::new(StringArray::from(s)),
    ];
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
    Table::split(
        name,
        schema,
        &[batch],
        partitions,
        &[1, 7, 49, 50, 51, 100, 300],
    )
}

/// An empty table `name` with the columns of [`random_table`], in 2 partitions.
pub fn empty_table(name: &str) -> Table {
    Table {
        name: name.to_owned(),
        schema: random_schema(),
        partitions: vec![Vec::new(), Vec::new()],
    }
}

fn random_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("k", DataType::Int64, true),
        Field::new("k2", DataType::Int32, true),
        Field::new("v", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
    ]))
}

/// The 8 TPC-H tables at scale factor `sf`, generated in memory, each in
/// `partitions` partitions of batches of at most 4,096 rows (nation and region,
/// 25 and 5 rows, in batches of 4 and 2 rows so that every partition has some).
pub fn tpch_tables(sf: f64, partitions: usize) -> Vec<Table> {
    use tpchgen::generators::{
        CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, PartGenerator,
        PartSuppGenerator, RegionGenerator, SupplierGenerator,
    };
    use tpchgen_arrow::{
        CustomerArrow, LineItemArrow, NationArrow, OrderArrow, PartArrow, PartSuppArrow,
        RegionArrow, SupplierArrow,
    };
    fn table<I>(name: &str, batches: I, partitions: usize, rows: usize) -> Table
    where
        I: Iterator<Item = Result<RecordBatch, datafusion::arrow::error::ArrowError>>,
    {
        let batches: Vec<RecordBatch> = batches.map(|b| b.unwrap()).collect();
        let schema = batches[0].schema();
        Table::split(name, schema, &batches, partitions, &[rows])
    }
    vec![
        table(
            "nation",
            NationArrow::new(NationGenerator::new(sf, 1, 1)),
            partitions,
            4,
        ),
        table(
            "region",
            RegionArrow::new(RegionGenerator::new(sf, 1, 1)),
            partitions,
            2,
        ),
        table(
            "part",
            PartArrow::new(PartGenerator::new(sf, 1, 1)),
            partitions,
            4096,
        ),
        table(
            "supplier",
            SupplierArrow::new(SupplierGenerator::new(sf, 1, 1)),
            partitions,
            4096,
        ),
        table(
            "partsupp",
            PartSuppArrow::new(PartSuppGenerator::new(sf, 1, 1)),
            partitions,
            4096,
        ),
        table(
            "customer",
            CustomerArrow::new(CustomerGenerator::new(sf, 1, 1)),
            partitions,
            4096,
        ),
        table(
            "orders",
            OrderArrow::new(OrderGenerator::new(sf, 1, 1)),
            partitions,
            4096,
        ),
        table(
            "lineitem",
            LineItemArrow::new(LineItemGenerator::new(sf, 1, 1)),
            partitions,
            4096,
        ),
    ]
}

/// The TPC-H query texts, Q1 first (tests/tpch.rs, and the Ballista crate's
/// cluster test).
pub const TPCH_QUERIES: [&str; 22] = [
    include_str!("../tpch/q1.sql"),
    include_str!("../tpch/q2.sql"),
    include_str!("../tpch/q3.sql"),
    include_str!("../tpch/q4.sql"),
    include_str!("../tpch/q5.sql"),
    include_str!("../tpch/q6.sql"),
    include_str!("../tpch/q7.sql"),
    include_str!("../tpch/q8.sql"),
    include_str!("../tpch/q9.sql"),
    include_str!("../tpch/q10.sql"),
    include_str!("../tpch/q11.sql"),
    include_str!("../tpch/q12.sql"),
    include_str!("../tpch/q13.sql"),
    include_str!("../tpch/q14.sql"),
    include_str!("../tpch/q15.sql"),
    include_str!("../tpch/q16.sql"),
    include_str!("../tpch/q17.sql"),
    include_str!("../tpch/q18.sql"),
    include_str!("../tpch/q19.sql"),
    include_str!("../tpch/q20.sql"),
    include_str!("../tpch/q21.sql"),
    include_str!("../tpch/q22.sql"),
];

/// The TPC-H queries whose ORDER BY orders every row of the answer (on the group
/// keys, or ending in a unique column); the others are compared as multisets of rows.
pub const TPCH_ORDERED: [usize; 13] = [1, 2, 4, 7, 8, 9, 12, 13, 15, 16, 20, 21, 22];
