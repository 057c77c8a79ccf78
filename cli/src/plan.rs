//! Planning a command-line join: everything resolved and checked before any row is
//! read — the columns each input must decode, the filter, the output columns, the
//! inputs' statistics, the build side — and printed by `--explain`.
//!
//! ```text
//!  inputs (schemas) ─┬─ --on keys ────────┐
//!                    ├─ --select columns ─┼─► columns to decode per input
//!                    └─ --filter columns ─┘        │
//!                                                  ▼
//!        statistics (Parquet footer, file sizes) ─► HashJoinBuilder ─► HashJoin
//!                                                   (build side and why, key types,
//!                                                    partition bits)
//! ```

use std::num::NonZeroUsize;
use std::sync::Arc;

use anyhow::Result;
use arrow_schema::{Schema, SchemaRef};
use spilljoin::memory::{
    default_memory_limit_bytes, GreedyMemoryPool, MemoryPool, TrackConsumersPool,
};
use spilljoin::spill::SpillConfig;
use spilljoin::{
    HashJoin, HashJoinBuilder, InputStatistics, JoinError, JoinType, NullEquality, Side,
};

use super::args::RunArgs;
use super::failure::Kind;
use super::filter::Filter;
use super::input::Input;
use super::output::OutputSpec;
use super::progress::human_bytes;
use super::pushdown::PushdownMode;
use super::select::{self, Selected};
use super::suggest::no_such_column;

/// What the user asked for.
pub struct JoinRequest {
    /// The left input.
    pub left: Input,
    /// The right input.
    pub right: Input,
    /// Key pairs by name, left then right.
    pub on: Vec<(String, String)>,
    /// The join type.
    pub join_type: JoinType,
    /// How null keys compare.
    pub null_equality: NullEquality,
    /// `--select`.
    pub select: Option<Vec<String>>,
    /// `--filter`.
    pub filter: Option<String>,
    /// Where the output goes.
    pub output: OutputSpec,
    /// Whether the smaller input may build.
    pub swap: bool,
    /// What the probe scan may skip.
    pub pushdown: PushdownMode,
    /// Run settings.
    pub run: RunArgs,
}

/// A join ready to run.
pub struct Plan {
    /// The request it came from.
    pub request: JoinRequest,
    /// Columns of the left input to decode (ascending indices into its schema).
    pub left_columns: Vec<usize>,
    /// Columns of the right input to decode.
    pub right_columns: Vec<usize>,
    /// What is known of the left input's size.
    pub left_stats: InputStatistics,
    /// What is known of the right input's size.
    pub right_stats: InputStatistics,
    /// The filter, checked.
    pub filter: Option<Filter>,
    /// The join definition without a spill manager (added when it runs).
    pub builder: HashJoinBuilder,
    /// The join as planned (build side, key types, partitions).
    pub join: HashJoin,
    /// The output's schema, with the selected columns' names.
    pub schema: SchemaRef,
    /// Whether output batches are renamed to `schema` (a selection).
    pub rename: bool,
    /// The memory limit in bytes.
    pub limit_bytes: u64,
    /// Whether the limit was given (else the default).
    pub limit_given: bool,
    /// Worker threads.
    pub threads: usize,
    /// The spill settings.
    pub spill: SpillConfig,
}

impl Plan {
    /// Resolves and checks `request`.
    ///
    /// # Errors
    /// Definition failures (unknown columns, key types, filter, selection) and
    /// input failures (file sizes).
    pub fn new(request: JoinRequest) -> Result<Self> {
        let (left, right) = (&request.left, &request.right);
        let join_type = request.join_type;
        let selected = request
            .select
            .as_deref()
            .map(|names| select::resolve(names, join_type, left.schema(), right.schema()))
            .transpose()?;
        let filter = request
            .filter
            .as_deref()
            .map(|text| Filter::parse(text, left.schema(), right.schema()))
            .transpose()?;
        let needed =
            |side, schema| needed(side, schema, &request, selected.as_deref(), filter.as_ref());
        let left_columns = needed(Side::Left, left.schema())?;
        let right_columns = needed(Side::Right, right.schema())?;
        let left_schema = Arc::new(left.schema().project(&left_columns)?);
        let right_schema = Arc::new(right.schema().project(&right_columns)?);
        let left_stats = left.statistics(&left_columns)?;
        let right_stats = right.statistics(&right_columns)?;

        let run = &request.run;
        let limit_bytes = run.memory_limit.unwrap_or_else(default_memory_limit_bytes);
        let threads = run
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let mut builder = join_builder(
            &request,
            (&left_schema, &right_schema),
            (left_stats, right_stats),
            limit_bytes,
            threads,
        );
        if let Some(selected) = &selected {
            let sides = join_type.output_sides();
            let projection = select::projection(selected, &left_schema, &right_schema, sides)?;
            builder = builder.with_projection(projection);
        }
        if let Some(filter) = &filter {
            builder = builder.with_filter(filter.join_filter(&left_schema, &right_schema)?);
        }
        let join = builder.clone().build().map_err(|e| key_hint(e, &request))?;
        let (schema, rename) = output_schema(&join, selected.as_deref(), &request);
        Ok(Self {
            left_columns,
            right_columns,
            left_stats,
            right_stats,
            filter,
            builder,
            join,
            schema,
            rename,
            limit_bytes,
            limit_given: run.memory_limit.is_some(),
            threads,
            spill: spill_config(run),
            request,
        })
    }

    /// Whether the probe scan skips what the build rules out: a Parquet probe input,
    /// a join type that does not need unmatchable probe rows, and `--pushdown` not
    /// `none`.
    pub fn pushdown_applies(&self) -> bool {
        let probe = match self.join.build_side() {
            Side::Left => &self.request.right,
            Side::Right => &self.request.left,
        };
        self.request.pushdown != PushdownMode::None
            && self.join.may_skip_unmatchable_probe_rows()
            && probe.format() == crate::format::Format::Parquet
    }

    fn pushdown_text(&self) -> String {
        if self.pushdown_applies() {
            match self.request.pushdown {
                PushdownMode::All => "the probe scan skips row groups and pages outside the build's key bounds, and rows whose key is not in the build".into(),
                _ => "the probe scan skips row groups and pages outside the build's key bounds".into(),
            }
        } else if self.request.pushdown == PushdownMode::None {
            "none (--pushdown none)".into()
        } else if !self.join.may_skip_unmatchable_probe_rows() {
            format!(
                "none: a {} join needs every probe row",
                self.request.join_type
            )
        } else {
            "none: the probe input is not Parquet".into()
        }
    }

    /// The plan as `--explain` prints it: one line per decision, the key in a
    /// column of its own.
    pub fn explain(&self) -> String {
        let r = &self.request;
        let mut out = String::new();
        let mut line = |key: &str, value: String| {
            out.push_str(&format!("{key:<13}{value}\n"));
        };
        line(
            "join",
            format!("{} ({})", r.join_type, nulls(r.null_equality)),
        );
        for (input, columns, stats) in [
            (&r.left, &self.left_columns, self.left_stats),
            (&r.right, &self.right_columns, self.right_stats),
        ] {
            let names: Vec<&str> = columns.iter().map(|&i| r_name(input.schema(), i)).collect();
            line(&format!("{}", input.side()), input.describe());
            line("", format!("reads {} ({})", names.join(", "), size(stats)));
        }
        line(
            "build side",
            format!(
                "{} — {}",
                self.join.build_side(),
                self.join.build_side_reason()
            ),
        );
        line("keys", self.keys_text());
        line("pushdown", self.pushdown_text());
        line(
            "filter",
            match &self.filter {
                Some(f) => f.text().to_string(),
                None => "none".into(),
            },
        );
        line("partitions", self.partitions_text());
        line("memory limit", self.memory_limit_text());
        line("spill", self.spill_text());
        line(
            "threads",
            format!("{}, batches of {} rows", self.threads, r.run.batch_size),
        );
        line("output", self.output_text());
        out
    }

    /// `--explain`'s keys: each pair and the type they are compared as.
    fn keys_text(&self) -> String {
        let keys: Vec<String> = self
            .request
            .on
            .iter()
            .zip(self.join.key_types())
            .map(|((l, r), t)| format!("left.{l} = right.{r} ({t})"))
            .collect();
        keys.join(", ")
    }

    /// `--explain`'s partitions: how many at level 0, and how they split further.
    fn partitions_text(&self) -> String {
        let bits = self.join.partition_bits();
        format!(
            "{} at level 0 ({bits} hash bits); a spilled partition is split 16 ways per level, up to {} levels",
            1u64 << bits,
            self.join.max_depth()
        )
    }

    /// `--explain`'s memory limit, and where it came from.
    fn memory_limit_text(&self) -> String {
        format!(
            "{} ({})",
            human_bytes(self.limit_bytes),
            if self.limit_given {
                "--memory-limit"
            } else {
                "default: 75% of the memory available now"
            }
        )
    }

    /// `--explain`'s spill settings: the directory, compression and quota.
    fn spill_text(&self) -> String {
        let dir = self
            .spill
            .root_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        format!(
            "{} (compression {}, {})",
            dir.display(),
            self.spill.compression,
            match self.spill.disk_quota_bytes {
                Some(q) => format!("at most {}", human_bytes(q)),
                None => "no size limit".into(),
            }
        )
    }

    /// `--explain`'s output: its columns and where they go.
    fn output_text(&self) -> String {
        let columns: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        format!(
            "{} → {}",
            columns.join(", "),
            self.request.output.describe()
        )
    }
}

/// The join's pool: greedy under the limit, naming its largest consumers when it
/// refuses a reservation.
fn memory_pool(limit_bytes: u64) -> Arc<dyn MemoryPool> {
    Arc::new(TrackConsumersPool::new(
        GreedyMemoryPool::new(usize::try_from(limit_bytes).unwrap_or(usize::MAX)),
        NonZeroUsize::MIN.saturating_add(4),
    ))
}

/// The join as requested over the decoded columns (`schemas`, left then right),
/// before the selection and the filter are added.
fn join_builder(
    request: &JoinRequest,
    (left_schema, right_schema): (&SchemaRef, &SchemaRef),
    (left_stats, right_stats): (InputStatistics, InputStatistics),
    limit_bytes: u64,
    threads: usize,
) -> HashJoinBuilder {
    let run = &request.run;
    HashJoinBuilder::new(
        Arc::clone(left_schema),
        Arc::clone(right_schema),
        request.on.clone(),
    )
    .with_join_type(request.join_type)
    .with_null_equality(request.null_equality)
    .with_memory_pool(memory_pool(limit_bytes))
    .with_batch_size(run.batch_size)
    .with_max_depth(run.max_depth)
    .with_threads(threads)
    .with_statistics(left_stats, right_stats)
    .with_side_swap(request.swap)
}

/// The output's schema, and whether batches are renamed to it: the selected
/// columns under their names, else the join's own schema.
fn output_schema(
    join: &HashJoin,
    selected: Option<&[Selected]>,
    request: &JoinRequest,
) -> (SchemaRef, bool) {
    match selected {
        Some(selected) => (
            Arc::new(select::output_schema(
                &join.schema(),
                selected,
                request.join_type.output_sides(),
                request.left.schema(),
                request.right.schema(),
            )),
            true,
        ),
        None => (join.schema(), false),
    }
}

/// Where and how the join spills (`--spill-dir`, `--spill-compression`,
/// `--max-spill-size`).
fn spill_config(run: &RunArgs) -> SpillConfig {
    SpillConfig {
        root_dir: run.spill_dir.clone(),
        compression: run.spill_compression,
        disk_quota_bytes: run.max_spill_size,
        ..SpillConfig::default()
    }
}

fn r_name(schema: &Schema, i: usize) -> &str {
    schema.fields().get(i).map_or("?", |f| f.name().as_str())
}

fn nulls(n: NullEquality) -> &'static str {
    match n {
        NullEquality::NullEqualsNull => "null keys equal each other",
        _ => "null keys match nothing",
    }
}

fn size(stats: InputStatistics) -> String {
    let bytes = stats.bytes.map(|b| format!("about {}", human_bytes(b)));
    let rows = stats.rows.map(|r| format!("{r} rows"));
    match (bytes, rows) {
        (Some(b), Some(r)) => format!("{b}, {r}"),
        (Some(b), None) => b,
        (None, Some(r)) => r,
        (None, None) => "size unknown".into(),
    }
}

/// The columns `side` must decode: its keys, the filter's columns, and what the
/// output needs; ascending.
fn needed(
    side: Side,
    schema: &SchemaRef,
    request: &JoinRequest,
    selected: Option<&[Selected]>,
    filter: Option<&Filter>,
) -> Result<Vec<usize>> {
    let mut names: Vec<&str> = request
        .on
        .iter()
        .map(|(l, r)| {
            if side == Side::Left {
                l.as_str()
            } else {
                r.as_str()
            }
        })
        .collect();
    let key_count = names.len();
    match selected {
        Some(sel) => names.extend(sel.iter().filter_map(|s| match s {
            Selected::Column { side: s, name } if *s == side => Some(name.as_str()),
            _ => None,
        })),
        None if request.join_type.output_sides().contains(&side) => {
            names.extend(schema.fields().iter().map(|f| f.name().as_str()))
        }
        None => {}
    }
    if let Some(filter) = filter {
        names.extend(filter.columns().filter(|(s, _)| *s == side).map(|(_, n)| n));
    }
    let mut indices = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        let index = schema.index_of(name).map_err(|_| {
            let e = no_such_column(side, name, schema);
            if i < key_count {
                e.context(format!("--on: key column {name:?}"))
            } else {
                e
            }
        })?;
        if !indices.contains(&index) {
            indices.push(index);
        }
    }
    indices.sort_unstable();
    Ok(indices)
}

/// A definition error of the library, with a hint where the inputs' types are
/// inferred.
fn key_hint(e: JoinError, request: &JoinRequest) -> anyhow::Error {
    if let JoinError::KeyTypeMismatch {
        left_column,
        right_column,
        ..
    } = &e
    {
        let flags: Vec<String> = [(&request.left, left_column), (&request.right, right_column)]
            .into_iter()
            .filter(|(input, _)| input.format().is_text())
            .map(|(input, column)| format!("--{}-schema {column}:TYPE", input.side()))
            .collect();
        if !flags.is_empty() {
            return Kind::Definition.error(format!(
                "{e}; the types of CSV and NDJSON inputs are inferred: set one with {}",
                flags.join(" or ")
            ));
        }
    }
    anyhow::Error::new(e)
}
