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
use super::direct_io::{self, build_and_probe, expected_spill_bytes};
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
    /// What of the limit the input readers' decoded pages take, outside the join's
    /// pool ([`reader_pages_in_pool`]); the join has the rest.
    pub reader_pages_in_pool: u64,
    /// What of the limit the direct I/O buffers take, outside the join's pool
    /// ([`direct_io::buffers_in_pool`]).
    pub direct_io_in_pool: u64,
    /// Worker threads.
    pub threads: usize,
    /// The spill settings.
    pub spill: SpillConfig,
    /// Why spill files are (or are not) written with direct I/O.
    pub direct_io_reason: String,
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
        let limit_given = run.memory_limit.is_some();
        let threads = run
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let pages = |input, columns| input_pages(input, columns, threads, limit_given);
        let reader_pages_in_pool = reader_pages_in_pool(
            pages(left, &left_columns).max(pages(right, &right_columns)),
            limit_bytes,
            limit_given,
        );
        let mut builder = join_builder(
            &request,
            (&left_schema, &right_schema),
            (left_stats, right_stats),
            limit_bytes - reader_pages_in_pool,
            threads,
        );
        let schemas = (&left_schema, &right_schema);
        let (selected_ref, filter_ref) = (selected.as_deref(), filter.as_ref());
        builder = select_and_filter(builder, join_type, selected_ref, filter_ref, schemas)?;
        let (join, direct_io, direct_io_in_pool) =
            build_with_direct_io(&mut builder, &request, (left_stats, right_stats), threads)?;
        let (schema, rename) = output_schema(&join, selected.as_deref(), &request);
        let spill = spill_config(run, &direct_io);
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
            limit_given,
            reader_pages_in_pool,
            direct_io_in_pool,
            threads,
            spill,
            direct_io_reason: direct_io.reason,
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

    /// `--explain`'s spill settings: the directory, compression, quota and direct I/O.
    fn spill_text(&self) -> String {
        let dir = self
            .spill
            .root_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        format!(
            "{} (compression {}, {}, direct I/O {}: {})",
            dir.display(),
            self.spill.compression,
            match self.spill.disk_quota_bytes {
                Some(q) => format!("at most {}", human_bytes(q)),
                None => "no size limit".into(),
            },
            match self.spill.direct_io {
                true => format!(
                    "on, {} MiB read ahead, {} writes behind a thread",
                    self.spill.direct_read_ahead, self.spill.direct_writes_behind
                ),
                false => "off".into(),
            },
            self.direct_io_reason
        ) + &match self.direct_io_in_pool {
            0 => String::new(),
            bytes => format!(
                "; its buffers' {} come out of the limit",
                human_bytes(bytes)
            ),
        }
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

/// How many readers decode an input at once: one per thread, unless a memory limit
/// is given and their pages would take more than [`READER_PAGES_BYTES`]. A Parquet
/// reader holds its column chunks' current pages, decoded, outside the pool (a
/// view column's values stay in them): 16 string columns of 1 MiB pages are about
/// 37 MiB a reader, and two of them took a join's peak RSS past its bound
/// (`1.1 × limit + 64 MiB`) under a 64 MiB limit. The workers share the readers
/// (decoding is then serialized; joining is not).
pub fn readers(threads: usize, limit_given: bool, page_bytes: u64) -> usize {
    if !limit_given || page_bytes == 0 {
        return threads;
    }
    let fit = usize::try_from(READER_PAGES_BYTES / page_bytes).unwrap_or(usize::MAX);
    threads.min(fit.max(1))
}

/// What the readers of one input may hold in decoded pages outside the pool, of the
/// bound's 64 MiB above the limit (the rest is the process's own: its code, its
/// allocator's free memory, the output writer's buffer).
const READER_PAGES_BYTES: u64 = 32 << 20;

/// The decoded pages the readers of `columns` of `input` hold at most.
fn input_pages(input: &Input, columns: &[usize], threads: usize, limit_given: bool) -> u64 {
    let page_bytes = input.page_bytes(columns);
    page_bytes.saturating_mul(readers(threads, limit_given, page_bytes) as u64)
}

/// What of `pages` (the decoded pages of the readers of the input that holds more;
/// the build's are freed before the probe's are read) is taken from the join's
/// memory under `limit_bytes`: what is over [`READER_PAGES_BYTES`] (one reader of
/// rows wide enough has more), at most a quarter of the limit, so that the join
/// keeps most of it. Left outside the pool, such a reader's pages and a full pool
/// together take a join's peak RSS to its bound.
fn reader_pages_in_pool(pages: u64, limit_bytes: u64, limit_given: bool) -> u64 {
    if !limit_given {
        return 0;
    }
    pages
        .saturating_sub(READER_PAGES_BYTES)
        .min(limit_bytes / 4)
}

/// `builder` with the `--select` projection and the `--filter` predicate, if given.
fn select_and_filter(
    mut builder: HashJoinBuilder,
    join_type: JoinType,
    selected: Option<&[Selected]>,
    filter: Option<&Filter>,
    (left, right): (&SchemaRef, &SchemaRef),
) -> Result<HashJoinBuilder> {
    if let Some(selected) = selected {
        let sides = join_type.output_sides();
        builder = builder.with_projection(select::projection(selected, left, right, sides)?);
    }
    if let Some(filter) = filter {
        builder = builder.with_filter(filter.join_filter(left, right)?);
    }
    Ok(builder)
}

/// The join `builder` makes, whether it spills with direct I/O, and what of the limit
/// the direct I/O buffers take: under a given limit they come out of the join's pool,
/// and the join is made again with the rest ([`direct_io::buffers_in_pool`]).
fn build_with_direct_io(
    builder: &mut HashJoinBuilder,
    request: &JoinRequest,
    stats: (InputStatistics, InputStatistics),
    threads: usize,
) -> Result<(HashJoin, direct_io::DirectIoChoice, u64)> {
    let run = &request.run;
    let join = builder.clone().build().map_err(|e| key_hint(e, request))?;
    let mut direct_io = choose_direct_io(run, &join, stats, threads);
    let join_limit = join.memory_limit() as u64;
    direct_io.depth = direct_io::depth(direct_io.direct, threads, join_limit);
    let limit_given = run.memory_limit.is_some();
    let in_pool = direct_io::buffers_in_pool(&direct_io, limit_given, threads, join_limit);
    if in_pool == 0 {
        return Ok((join, direct_io, 0));
    }
    *builder = builder
        .clone()
        .with_memory_pool(memory_pool(join_limit - in_pool));
    let join = builder.clone().build().map_err(|e| key_hint(e, request))?;
    Ok((join, direct_io, in_pool))
}

/// Whether `join` spills with direct I/O (`--spill-direct-io`; `auto` from the
/// spill expected of the inputs' statistics under the join's limit).
fn choose_direct_io(
    run: &RunArgs,
    join: &HashJoin,
    (left, right): (InputStatistics, InputStatistics),
    threads: usize,
) -> direct_io::DirectIoChoice {
    let (build, probe) = build_and_probe(join.build_side(), left, right);
    let join_limit = join.memory_limit() as u64;
    let situation = direct_io::Situation {
        expected_spill: expected_spill_bytes(build, probe, join_limit),
        available: spilljoin::memory::available_memory_bytes(),
        buffers: direct_io::buffer_bytes(threads, direct_io::SHALLOW),
        join_limit,
    };
    direct_io::decide(run.spill_direct_io, situation)
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

/// Where and how the join spills: `--spill-dir`, `--spill-compression`,
/// `--max-spill-size` from `run`, and the direct I/O chosen with the plan.
fn spill_config(run: &RunArgs, direct_io: &direct_io::DirectIoChoice) -> SpillConfig {
    SpillConfig {
        root_dir: run.spill_dir.clone(),
        compression: run.spill_compression,
        disk_quota_bytes: run.max_spill_size,
        direct_io: direct_io.direct,
        direct_read_ahead: direct_io.depth.read_ahead,
        direct_writes_behind: direct_io.depth.writes_behind,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_whose_pages_are_large_are_read_by_fewer_readers_under_a_limit() {
        let mib = 1 << 20;
        assert_eq!(readers(2, true, 4 * mib), 2);
        assert_eq!(readers(2, true, 16 * mib), 2);
        assert_eq!(readers(2, true, 17 * mib), 1);
        assert_eq!(readers(8, true, 10 * mib), 3);
        // However large, one reader; without a limit, or with no pages, one a thread.
        assert_eq!(readers(2, true, u64::MAX), 1);
        assert_eq!(readers(2, false, 100 * mib), 2);
        assert_eq!(readers(2, true, 0), 2);
    }

    /// A reader's pages over what readers may hold outside the pool come out of the
    /// join's memory, a quarter of the limit at most; none without a limit.
    #[test]
    fn pages_over_the_readers_share_come_out_of_the_join_memory() {
        let mib = 1 << 20;
        assert_eq!(reader_pages_in_pool(20 * mib, 64 * mib, true), 0);
        assert_eq!(reader_pages_in_pool(32 * mib, 64 * mib, true), 0);
        assert_eq!(reader_pages_in_pool(37 * mib, 64 * mib, true), 5 * mib);
        assert_eq!(reader_pages_in_pool(100 * mib, 64 * mib, true), 16 * mib);
        assert_eq!(reader_pages_in_pool(37 * mib, 64 * mib, false), 0);
    }
}
