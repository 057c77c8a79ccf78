//! Build-side facts pushed into the probe scan: once the build side is built, a
//! Parquet probe input skips what cannot match.
//!
//! ```text
//!  build done ─► PreparedBuild: key bounds (min/max per key), membership (hash table,
//!                bloom filters of spilled partitions)
//!  probe reader (opened lazily, after the build):
//!    row groups whose key statistics lie outside the bounds ─► not read   (bounds)
//!    pages of the first key whose statistics do                ─► not read   (bounds)
//!    rows whose key is no member: dropped after decoding only the key
//!    columns (arrow's RowFilter), before the other columns      ─► (membership)
//! ```
//!
//! Only for join types that do not output unmatched probe rows and need no fact about
//! them ([`spilljoin::HashJoin::may_skip_unmatchable_probe_rows`]): inner, the
//! build-preserving outer join, semi joins, build-side anti and mark joins. With
//! nulls equal to nulls, row groups and pages holding nulls are kept.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arrow_array::{Array, ArrayRef, BooleanArray, Datum, Scalar};
use arrow_schema::{ArrowError, Schema};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{
    ArrowPredicateFn, ArrowReaderMetadata, RowFilter, RowSelection, RowSelector,
};
use parquet::arrow::ProjectionMask;
use spilljoin::{KeyBounds, NullEquality, PreparedBuild};

/// How much of the build's facts the probe scan uses (`--pushdown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PushdownMode {
    /// Read every probe row.
    None,
    /// Skip row groups and pages whose key statistics lie outside the build's key
    /// bounds (the default: it costs nothing when it skips nothing).
    #[default]
    Bounds,
    /// Bounds, and drop rows whose key is not in the build before decoding their
    /// other columns (arrow's `RowFilter` with the build's bloom filter). Measured
    /// slower on TPC-H even when it drops 85% of the rows (BENCHMARKS.md), so it is
    /// opt-in; it turns itself off after a million rows if it drops less than 30%.
    All,
}

/// What the probe scan skipped.
#[derive(Debug, Default)]
pub struct PushdownCounters {
    /// Row groups the probe scan was asked for.
    pub row_groups: AtomicU64,
    /// Row groups skipped by the bounds.
    pub row_groups_skipped: AtomicU64,
    /// Rows in the skipped row groups and pages.
    pub rows_skipped_by_bounds: AtomicU64,
    /// Compressed bytes of the probe's columns in the skipped row groups and pages.
    pub bytes_skipped: AtomicU64,
    /// Pages (of the first key column) skipped by the bounds.
    pub pages_skipped: AtomicU64,
    /// Rows whose key the membership filter tested.
    pub rows_tested: AtomicU64,
    /// Rows the membership filter dropped.
    pub rows_dropped_by_membership: AtomicU64,
}

impl PushdownCounters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// A counter's value.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The probe side's share of the pushdown: where the build will appear, and which
/// probe columns are its keys.
pub struct ProbePushdown {
    /// Set when the build is done, before the probe input is read.
    pub build: Arc<OnceLock<PreparedBuild>>,
    /// The probe key columns' names, in key order.
    pub keys: Vec<String>,
    /// What to use.
    pub mode: PushdownMode,
    /// How nulls compare.
    pub null_equality: NullEquality,
    /// What was skipped.
    pub counters: Arc<PushdownCounters>,
}

/// How a Parquet reader of some row groups should read, after the pushdown.
pub struct ScanPlan {
    /// The row groups still to read.
    pub row_groups: Vec<usize>,
    /// Rows to read within them (pages skipped), if any were.
    pub selection: Option<RowSelection>,
    /// The membership filter.
    pub row_filter: Option<RowFilter>,
}

impl ProbePushdown {
    /// The scan of `row_groups` of one file, given the build (which must be done).
    /// `columns` are the root columns the reader decodes (for the skipped bytes).
    pub fn plan(
        &self,
        metadata: &ArrowReaderMetadata,
        row_groups: Vec<usize>,
        columns: &[usize],
    ) -> Result<ScanPlan, ArrowError> {
        let unchanged = |row_groups| ScanPlan {
            row_groups,
            selection: None,
            row_filter: None,
        };
        let Some(build) = self.build.get() else {
            return Ok(unchanged(row_groups));
        };
        if self.mode == PushdownMode::None {
            return Ok(unchanged(row_groups));
        }
        PushdownCounters::add(&self.counters.row_groups, row_groups.len() as u64);
        let schema = metadata.schema();
        let parquet_schema = metadata.parquet_schema();
        let meta = metadata.metadata();
        let bounds = build.key_bounds();
        let keep_nulls = self.null_equality == NullEquality::NullEqualsNull;
        let mut keep = vec![true; row_groups.len()];
        for (key, bound) in self.keys.iter().zip(&bounds) {
            let converter = StatisticsConverter::try_new(key, schema, parquet_schema)?;
            let groups = row_groups.iter().map(|&g| meta.row_group(g));
            let mins = converter.row_group_mins(groups.clone())?;
            let maxes = converter.row_group_maxes(groups.clone())?;
            let nulls = converter.row_group_null_counts(groups)?;
            let outside = outside_bounds(bound.as_ref(), build, &mins, &maxes)?;
            for (i, keep) in keep.iter_mut().enumerate() {
                let may_hold_null = !nulls.is_valid(i) || nulls.value(i) > 0;
                if outside.is_valid(i) && outside.value(i) && !(keep_nulls && may_hold_null) {
                    *keep = false;
                }
            }
        }
        let mut kept = Vec::with_capacity(row_groups.len());
        for (g, keep) in row_groups.into_iter().zip(keep) {
            if keep {
                kept.push(g);
            } else {
                let group = meta.row_group(g);
                PushdownCounters::add(&self.counters.row_groups_skipped, 1);
                PushdownCounters::add(
                    &self.counters.rows_skipped_by_bounds,
                    group.num_rows().max(0) as u64,
                );
                PushdownCounters::add(
                    &self.counters.bytes_skipped,
                    projected_bytes(metadata, g, columns),
                );
            }
        }
        let selection = self.page_selection(metadata, &kept, build, &bounds, keep_nulls)?;
        let row_filter = (self.mode == PushdownMode::All && self.membership_pays())
            .then(|| self.row_filter(metadata, build))
            .transpose()?;
        Ok(ScanPlan {
            row_groups: kept,
            selection,
            row_filter,
        })
    }

    /// Rows of `row_groups` to read: pages of the first key column whose statistics
    /// lie outside its bounds are skipped. `None` without a page index or when no page
    /// can be skipped.
    fn page_selection(
        &self,
        metadata: &ArrowReaderMetadata,
        row_groups: &[usize],
        build: &PreparedBuild,
        bounds: &[Option<KeyBounds>],
        keep_nulls: bool,
    ) -> Result<Option<RowSelection>, ArrowError> {
        let meta = metadata.metadata();
        let (Some(column_index), Some(offset_index), Some(key)) =
            (meta.column_index(), meta.offset_index(), self.keys.first())
        else {
            return Ok(None);
        };
        let converter =
            StatisticsConverter::try_new(key, metadata.schema(), metadata.parquet_schema())?;
        let Some(counts) =
            converter.data_page_row_counts(offset_index, meta.row_groups(), row_groups)?
        else {
            return Ok(None);
        };
        let mins = converter.data_page_mins(column_index, offset_index, row_groups)?;
        let maxes = converter.data_page_maxes(column_index, offset_index, row_groups)?;
        let nulls = converter.data_page_null_counts(column_index, offset_index, row_groups)?;
        if mins.len() != counts.len() {
            return Ok(None);
        }
        let outside = outside_bounds(
            bounds.first().and_then(|b| b.as_ref()),
            build,
            &mins,
            &maxes,
        )?;
        let mut selectors: Vec<RowSelector> = Vec::with_capacity(counts.len());
        let (mut skipped_pages, mut skipped_rows) = (0u64, 0u64);
        for i in 0..counts.len() {
            let rows = counts.value(i) as usize;
            let may_hold_null = !nulls.is_valid(i) || nulls.value(i) > 0;
            let skip = outside.is_valid(i) && outside.value(i) && !(keep_nulls && may_hold_null);
            if skip {
                skipped_pages += 1;
                skipped_rows += rows as u64;
                selectors.push(RowSelector::skip(rows));
            } else {
                selectors.push(RowSelector::select(rows));
            }
        }
        if skipped_pages == 0 {
            return Ok(None);
        }
        PushdownCounters::add(&self.counters.pages_skipped, skipped_pages);
        PushdownCounters::add(&self.counters.rows_skipped_by_bounds, skipped_rows);
        Ok(Some(RowSelection::from(selectors)))
    }

    /// Whether to filter the next row group by membership: while learning (the first
    /// [`LEARN_ROWS`] rows), and then only if it has been dropping at least
    /// [`MIN_DROP_SHARE`] of the rows. Filtering decodes the key columns twice and
    /// tests every key, which only pays when enough rows go.
    fn membership_pays(&self) -> bool {
        let tested = PushdownCounters::get(&self.counters.rows_tested);
        let dropped = PushdownCounters::get(&self.counters.rows_dropped_by_membership);
        tested < LEARN_ROWS || dropped as f64 >= MIN_DROP_SHARE * tested as f64
    }

    /// The membership filter over the key columns.
    fn row_filter(
        &self,
        metadata: &ArrowReaderMetadata,
        build: &PreparedBuild,
    ) -> Result<RowFilter, ArrowError> {
        let schema: &Schema = metadata.schema();
        let roots = self
            .keys
            .iter()
            .map(|k| schema.index_of(k))
            .collect::<Result<Vec<_>, _>>()?;
        let mut sorted = roots.clone();
        sorted.sort_unstable();
        sorted.dedup();
        // The predicate's batch holds the key columns in schema order.
        let positions: Vec<usize> = roots
            .iter()
            .map(|r| sorted.iter().position(|s| s == r).unwrap_or(0))
            .collect();
        let mask = ProjectionMask::roots(metadata.parquet_schema(), sorted.iter().copied());
        let (build, counters) = (build.clone(), Arc::clone(&self.counters));
        let predicate = ArrowPredicateFn::new(mask, move |batch| {
            let keys: Vec<ArrayRef> = positions.iter().map(|&p| batch.column(p).clone()).collect();
            let members = build
                .may_contain(&keys)
                .map_err(|e| ArrowError::ExternalError(Box::new(e)))?;
            PushdownCounters::add(&counters.rows_tested, batch.num_rows() as u64);
            PushdownCounters::add(
                &counters.rows_dropped_by_membership,
                (members.len() - members.true_count()) as u64,
            );
            Ok(members)
        });
        Ok(RowFilter::new(vec![Box::new(predicate)]))
    }
}

/// Rows tested by the membership filter before deciding whether it pays.
const LEARN_ROWS: u64 = 1 << 20;

/// The share of rows the membership filter must drop to stay on.
const MIN_DROP_SHARE: f64 = 0.3;

/// Per statistics entry (row group or page): does its [min, max] lie entirely outside
/// the build's bounds? Null where unknown (missing statistics, types that do not
/// compare). A key column without bounds: outside everywhere if the build has no
/// non-null key of a type that keeps bounds, else unknown.
fn outside_bounds(
    bound: Option<&KeyBounds>,
    build: &PreparedBuild,
    mins: &ArrayRef,
    maxes: &ArrayRef,
) -> Result<BooleanArray, ArrowError> {
    let Some(bound) = bound else {
        // An empty build matches nothing.
        return Ok(if build.num_rows() == 0 {
            BooleanArray::from(vec![true; mins.len()])
        } else {
            BooleanArray::new_null(mins.len())
        });
    };
    let cast_to = |a: &ArrayRef| -> Option<ArrayRef> {
        if a.data_type() == mins.data_type() {
            Some(a.clone())
        } else {
            arrow_cast::cast(a.as_ref(), mins.data_type()).ok()
        }
    };
    let (Some(lo), Some(hi)) = (cast_to(&bound.min), cast_to(&bound.max)) else {
        return Ok(BooleanArray::new_null(mins.len()));
    };
    let below = arrow_ord::cmp::lt(maxes, &Scalar::new(lo) as &dyn Datum)?;
    let above = arrow_ord::cmp::gt(mins, &Scalar::new(hi) as &dyn Datum)?;
    arrow_arith::boolean::or_kleene(&below, &above)
}

/// Compressed bytes of `columns` (root indices) in row group `g`.
fn projected_bytes(metadata: &ArrowReaderMetadata, g: usize, columns: &[usize]) -> u64 {
    let descr = metadata.parquet_schema();
    metadata
        .metadata()
        .row_group(g)
        .columns()
        .iter()
        .enumerate()
        .filter(|(leaf, _)| columns.contains(&descr.get_column_root_idx(*leaf)))
        .map(|(_, c)| c.compressed_size().max(0) as u64)
        .sum()
}
