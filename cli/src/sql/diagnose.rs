//! What went wrong in a query, in the command line's terms: DataFusion's errors
//! sorted into the kinds of [`crate::failure`] (and so its exit codes), and its
//! "Resources exhausted" told as which operator ran out of memory.
//!
//! DataFusion's memory errors name a *memory consumer*, not an operator: the
//! fair pool says `Failed to allocate additional 10.0 MiB for ExternalSorterMerge[0]
//! with ...`, and the tracking pool around it adds the largest consumers. The
//! consumer's name before its `[partition]` tells the operator
//! ([`operator_of`]): `ExternalSorter` is a sort, `GroupedHashAggregateStream` an
//! aggregate, `SpilljoinExec` one of our joins. The user then knows whether the
//! join or something else needs the memory.
//!
//! | DataFusion error (its root cause) | kind |
//! |---|---|
//! | SQL syntax, planning, schema (unknown table or column), not implemented, configuration | definition (3) |
//! | Parquet, object store, I/O, Arrow's parse and I/O errors | input (4) |
//! | the spill quota (`--max-spill-size`), a spill directory | spill (6) |
//! | resources exhausted | memory (7) |
//! | execution, other Arrow errors (a cast, an overflow) | definition (3) |
//! | internal | internal (1) |

use arrow_schema::ArrowError;
use datafusion::common::DataFusionError;
use spilljoin::spill::SpillError;
use spilljoin::JoinError;

use crate::failure::Kind;
use crate::progress::human_bytes;

/// What a hint needs to know of the run.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `--memory-limit`, resolved.
    pub limit_bytes: u64,
    /// `--max-spill-size`, if given.
    pub max_spill_bytes: Option<u64>,
}

/// `e` told in the command line's terms, if a DataFusion error is in its chain;
/// else `e` as it is (the output's errors carry their kind already).
pub fn diagnose(e: anyhow::Error, limits: Limits) -> anyhow::Error {
    let Some(df) = e.chain().find_map(|c| c.downcast_ref::<DataFusionError>()) else {
        return e;
    };
    let root = df.find_root();
    let text = root.strip_backtrace().replace(['\n', '\r'], " ");
    if let Some(hint) = spill_quota_hint(df, limits) {
        // DataFusion's advice names its own settings, not our flags.
        let text = text.split(" Please try increasing").next().unwrap_or(&text);
        return Kind::Spill.error(format!("{text}; {hint}"));
    }
    match root {
        DataFusionError::ResourcesExhausted(message) => out_of_memory(message, limits),
        DataFusionError::SQL(..)
        | DataFusionError::Plan(_)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_)
        | DataFusionError::Configuration(_) => {
            Kind::Definition.error(format!("the query is invalid: {text}"))
        }
        DataFusionError::ParquetError(_)
        | DataFusionError::ObjectStore(_)
        | DataFusionError::IoError(_) => Kind::Input.error(format!("cannot read an input: {text}")),
        DataFusionError::ArrowError(arrow, _) => match arrow.as_ref() {
            ArrowError::ParseError(_)
            | ArrowError::CsvError(_)
            | ArrowError::JsonError(_)
            | ArrowError::IoError(..)
            | ArrowError::IpcError(_)
            | ArrowError::ParquetError(_) => {
                Kind::Input.error(format!("cannot read an input: {text}"))
            }
            _ => Kind::Definition.error(format!("the query failed: {text}")),
        },
        DataFusionError::External(inner) => external(inner.as_ref(), &text),
        DataFusionError::Execution(message) if message.starts_with("SpilljoinExec:") => {
            let kind = if message.contains("spill failed") {
                Kind::Spill
            } else {
                Kind::Internal
            };
            kind.error(text)
        }
        DataFusionError::Execution(_) => {
            Kind::Definition.error(format!("the query failed: {text}"))
        }
        _ => Kind::Internal.error(text),
    }
}

/// An error of the join engine, or another library's, inside DataFusion's.
fn external(inner: &(dyn std::error::Error + Send + Sync + 'static), text: &str) -> anyhow::Error {
    let kind = if let Some(join) = inner.downcast_ref::<JoinError>() {
        crate::failure::join_error_kind(join)
    } else if inner.downcast_ref::<SpillError>().is_some() {
        Kind::Spill
    } else if inner.downcast_ref::<std::io::Error>().is_some() {
        Kind::Input
    } else {
        Kind::Internal
    };
    kind.error(text.to_string())
}

/// What to do when the spill files reached `--max-spill-size`, if that is what
/// `e` says (DataFusion's disk manager, or a join's quota).
fn spill_quota_hint(e: &DataFusionError, limits: Limits) -> Option<String> {
    let text = e.strip_backtrace();
    let quota =
        text.contains("exceeded the allowable limit") || text.contains("spill disk quota exceeded");
    quota.then(|| match limits.max_spill_bytes {
        Some(bytes) => format!(
            "the spill files need more than --max-spill-size {}: raise it, or --memory-limit to spill less",
            human_bytes(bytes)
        ),
        None => "the spill files need more disk than there is: raise --memory-limit to spill less".into(),
    })
}

/// The one line for an operator that could not get memory, saying which one.
fn out_of_memory(message: &str, limits: Limits) -> anyhow::Error {
    let limit = human_bytes(limits.limit_bytes);
    let rerun = format!(
        "rerun with --memory-limit {}MiB or more",
        limits.limit_bytes.saturating_mul(2).div_ceil(1 << 20)
    );
    let message = message.replace(['\n', '\r'], " ");
    // The join's own refusal below its floor (spilljoin_datafusion's errors).
    if let Some(join) = message.strip_prefix("SpilljoinExec: ") {
        // Its causes repeat it in other words: the innermost says it best.
        let join = join.rsplit("resources exhausted: ").next().unwrap_or(join);
        return Kind::Memory.error(format!(
            "the memory limit {limit} is too small for a join of this query (SpilljoinExec): {join}; {rerun}"
        ));
    }
    let Some(refusal) = Refusal::parse(&message) else {
        return Kind::Memory.error(format!(
            "the memory limit {limit} is too small for this query: {message}; {rerun}"
        ));
    };
    let operator = operator_of(refusal.consumer);
    // Joins spilljoin did not replace are joins too: say only what the others are not.
    let not_join = if refusal.consumer.starts_with("SpilljoinExec") || operator.contains(" join") {
        ""
    } else {
        ", not a join"
    };
    Kind::Memory.error(format!(
        "{operator} ran out of memory{not_join}: {} of the memory limit {limit}; {rerun}",
        refusal.describe()
    ))
}

/// A pool's refusal, as DataFusion words it.
#[derive(Debug, PartialEq)]
struct Refusal<'a> {
    /// The consumer that asked: `ExternalSorterMerge[0]`.
    consumer: &'a str,
    /// What it asked for: `10.0 MiB`.
    requested: &'a str,
    /// What the pool had left: `1.9 MiB`.
    available: &'a str,
    /// The largest consumers, `NAME consumed SIZE`, if the pool tracks them.
    top: Vec<String>,
}

impl<'a> Refusal<'a> {
    /// The parts of `message`: `Failed to allocate additional A for NAME with B
    /// already allocated for this reservation - C remain available for the total
    /// memory pool: POOL`, perhaps after the tracking pool's `Additional allocation
    /// failed for NAME with top memory consumers (across reservations) as: LIST
    /// Error: `.
    fn parse(message: &'a str) -> Option<Self> {
        let core = &message[message.find("Failed to allocate additional ")?..];
        let rest = core.strip_prefix("Failed to allocate additional ")?;
        let (requested, rest) = rest.split_once(" for ")?;
        let (consumer, rest) = rest.split_once(" with ")?;
        let (_, rest) = rest.split_once(" - ")?;
        let (available, _) = rest.split_once(" remain available")?;
        let top = message
            .split_once("(across reservations) as:")
            .and_then(|(_, list)| list.split_once("Error: "))
            .map(|(list, _)| top_consumers(list))
            .unwrap_or_default();
        Some(Self {
            consumer,
            requested,
            available,
            top,
        })
    }

    fn describe(&self) -> String {
        let mut text = format!(
            "{} asked for {} more with {} left",
            self.consumer, self.requested, self.available
        );
        if !self.top.is_empty() {
            text.push_str(&format!(" (largest: {})", self.top.join(", ")));
        }
        text
    }
}

/// `NAME SIZE` of the entries of the tracking pool's list (`  NAME#ID(can spill:
/// B) consumed SIZE, peak SIZE,` one to a line, the last ending in `.`) that hold
/// memory, at most [`TOP_SHOWN`].
fn top_consumers(list: &str) -> Vec<String> {
    let pieces: Vec<&str> = list.split(", peak ").collect();
    pieces
        .iter()
        .enumerate()
        // The last piece is only the last entry's peak.
        .take(pieces.len().saturating_sub(1))
        .filter_map(|(i, piece)| {
            // After the first, a piece starts with the previous entry's peak.
            let entry = if i == 0 {
                *piece
            } else {
                piece.split_once(", ")?.1
            };
            let (head, consumed) = entry.split_once("(can spill: ")?;
            let name = head.rsplit_once('#').map_or(head, |(n, _)| n).trim();
            let consumed = consumed.split_once(" consumed ")?.1.trim();
            (!consumed.starts_with("0.0 ")).then(|| format!("{name} {consumed}"))
        })
        .take(TOP_SHOWN)
        .collect()
}

/// The most consumers an error lists.
const TOP_SHOWN: usize = 3;

/// The operator a DataFusion memory consumer belongs to, for a person:
/// `ExternalSorter[0]` is `a sort (SortExec)`.
fn operator_of(consumer: &str) -> String {
    let base = consumer
        .split(['[', ' ', '(', '#'])
        .next()
        .unwrap_or(consumer);
    let name = match base {
        "ExternalSorter" | "ExternalSorterMerge" => "a sort (SortExec)",
        "TopK" | "PartitionedTopK" | "PartitionedTopKRank" => "a sort with a limit (SortExec TopK)",
        "SortPreservingMergeExec" => "a merge of sorted partitions (SortPreservingMergeExec)",
        "GroupedHashAggregateStream"
        | "AggregateStream"
        | "SingleHashAggregateStream"
        | "PartialHashAggregateStream"
        | "FinalHashAggregateStream"
        | "PartialReduceHashAggregateStream"
        | "OrderedFinalAggregateStream"
        | "OrderedPartialAggregateStream" => "an aggregate (AggregateExec)",
        "RepartitionExec" => "a repartition (RepartitionExec)",
        "HashJoinInput" => "a hash join that spilljoin did not replace (HashJoinExec)",
        "NestedLoopJoinLoad" | "NestedLoopJoinGlobalRightBitmaps" => {
            "a nested loop join (NestedLoopJoinExec)"
        }
        "CrossJoinExec" => "a cross join (CrossJoinExec)",
        "SMJStream" => "a sort-merge join (SortMergeJoinExec)",
        "SymmetricHashJoinStream" => "a symmetric hash join (SymmetricHashJoinExec)",
        "PiecewiseMergeJoinInput" => "a piecewise merge join (PiecewiseMergeJoinExec)",
        "RecursiveQuery" | "RecursiveQueryHashTable" => "a recursive query (RecursiveQueryExec)",
        "BufferExec" => "a buffer (BufferExec)",
        "SpilljoinExec" => "a join (SpilljoinExec)",
        _ => return format!("the operator that reserves as {consumer}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{kind_of, one_line};

    const TRACKED: &str = "Additional allocation failed for ExternalSorterMerge[0] with top memory consumers (across reservations) as:
  ExternalSorter[0]#3(can spill: true) consumed 1.5 MiB, peak 1.9 MiB,
  SpilljoinExec[1]#7(can spill: true) consumed 120.0 KiB, peak 2.0 MiB,
  ExternalSorterMerge[0]#4(can spill: false) consumed 0.0 B, peak 0.0 B.
Error: Failed to allocate additional 10.0 MiB for ExternalSorterMerge[0] with 0.0 B already allocated for this reservation - 412.0 KiB remain available for the total memory pool: fair(pool_size: 2.0 MiB)";

    fn limits() -> Limits {
        Limits {
            limit_bytes: 2 << 20,
            max_spill_bytes: None,
        }
    }

    #[test]
    fn a_refusal_is_taken_apart() {
        let one_line = TRACKED.replace('\n', " ");
        let r = Refusal::parse(&one_line).unwrap();
        assert_eq!(r.consumer, "ExternalSorterMerge[0]");
        assert_eq!((r.requested, r.available), ("10.0 MiB", "412.0 KiB"));
        assert_eq!(
            r.top,
            ["ExternalSorter[0] 1.5 MiB", "SpilljoinExec[1] 120.0 KiB"]
        );
        // The fair pool's words alone, without the tracking pool's list.
        let plain = TRACKED.split("Error: ").nth(1).unwrap();
        let r = Refusal::parse(plain).unwrap();
        assert_eq!((r.consumer, r.top.len()), ("ExternalSorterMerge[0]", 0));
        assert_eq!(Refusal::parse("Memory Exhausted while sorting"), None);
    }

    #[test]
    fn operators_are_named_by_their_consumers() {
        assert_eq!(operator_of("ExternalSorter[0]"), "a sort (SortExec)");
        assert_eq!(
            operator_of("GroupedHashAggregateStream[1] (count(*))"),
            "an aggregate (AggregateExec)"
        );
        assert!(operator_of("HashJoinInput").contains("HashJoinExec"));
        assert_eq!(
            operator_of("Mystery"),
            "the operator that reserves as Mystery"
        );
    }

    #[test]
    fn a_sort_out_of_memory_is_not_called_a_join() {
        let df = DataFusionError::ResourcesExhausted(TRACKED.into())
            .context("Not enough memory to continue external sort");
        let e = diagnose(anyhow::Error::new(df), limits());
        assert_eq!(kind_of(&e), Kind::Memory);
        let line = one_line(&e);
        assert!(
            line.starts_with(
                "a sort (SortExec) ran out of memory, not a join: ExternalSorterMerge[0] asked \
                 for 10.0 MiB more with 412.0 KiB left (largest: ExternalSorter[0] 1.5 MiB, \
                 SpilljoinExec[1] 120.0 KiB) of the memory limit 2.0 MiB;"
            ),
            "{line}"
        );
        assert!(line.contains("--memory-limit 4MiB"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn a_hash_join_spilljoin_left_is_called_a_join() {
        let text = "Failed to allocate additional 511.2 KB for HashJoinInput[0] with 463.1 KB \
                    already allocated for this reservation - 10.0 KB remain available for the \
                    total memory pool: fair(pool_size: 2.0 MiB)";
        let df = DataFusionError::ResourcesExhausted(text.into());
        let line = one_line(&diagnose(anyhow::Error::new(df), limits()));
        assert!(
            line.starts_with(
                "a hash join that spilljoin did not replace (HashJoinExec) ran out of memory: "
            ),
            "{line}"
        );
    }

    #[test]
    fn kinds_follow_the_root_cause() {
        let plan = DataFusionError::Plan("table 'x' not found".into());
        let e = diagnose(anyhow::Error::new(plan), limits());
        assert_eq!(kind_of(&e), Kind::Definition);
        assert!(one_line(&e)
            .starts_with("the query is invalid: Error during planning: table 'x' not found"));
        let io = DataFusionError::IoError(std::io::Error::other(
            "The used disk space during the spilling process has exceeded the allowable limit of 0.0 B.",
        ));
        let e = diagnose(
            anyhow::Error::new(io),
            Limits {
                max_spill_bytes: Some(0),
                ..limits()
            },
        );
        assert_eq!(kind_of(&e), Kind::Spill);
        assert!(
            one_line(&e).contains("more than --max-spill-size 0 bytes"),
            "{}",
            one_line(&e)
        );
        let e = diagnose(anyhow::anyhow!("not datafusion's"), limits());
        assert_eq!(kind_of(&e), Kind::Internal);
    }
}
