//! Reading one spill file on several threads at once: the file cut, between two of
//! its writes, into consecutive parts that each reader reads on its own.
//!
//! A spill file is one IPC stream, and a stream is read front to back: a reader
//! needs the schema of the segment it is in (`narrow`) and every dictionary sent
//! before the batch it decodes. A write (`checksum`) is one record batch, with the
//! schema message of a new segment before it when one begins there, and the last
//! write is the end-of-stream marker. So a file without dictionary columns can be
//! cut before any write but the first and the last: the writer keeps each
//! segment's schema and the write it begins at, and a part that starts inside a
//! segment is given that schema instead of reading it.
//!
//! ```text
//!  writes:  [schema|b0] [b1] [b2] [schema'|b3] [b4] [b5] [end marker]
//!  parts:   └─── part 0 ─────┘ └──── part 1 (schema') ─────────────┘
//!           ends after b2, with no marker        ends with the marker
//! ```
//!
//! Each part is read over its own extents (a range of the writes' bytes, mapped onto
//! the file's extents), checks the checksums of its own writes, and all but the last
//! end at their last write instead of at the end-of-stream marker. A file with a
//! dictionary column is one part: its dictionaries may change between any two
//! batches.

use std::sync::Arc;

use arrow_schema::{DataType, SchemaRef};

use crate::checksum::Written;
use crate::file::Extent;

/// Where a segment of a file begins: the write whose bytes open with its schema
/// message, and that schema as written.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub(crate) first_write: usize,
    pub(crate) schema: SchemaRef,
}

/// One part of a file, for one reader.
pub(crate) struct Part {
    /// Where its writes' bytes are in the file.
    pub(crate) extents: Arc<[Extent]>,
    /// Its writes, hashed.
    pub(crate) written: Arc<[Written]>,
    /// The schema of the segment it begins in, as written: `None` for the first
    /// part, which opens with the file's schema message.
    pub(crate) segment: Option<SchemaRef>,
    /// Whether it ends after its last write rather than at the end-of-stream marker.
    pub(crate) open_ended: bool,
    /// Batches of the file before it (its writes before it: one batch each).
    pub(crate) first_batch: u64,
}

/// Whether a file of `schema` can be cut into parts: it has no dictionary column at
/// any depth.
pub(crate) fn splittable(schema: &SchemaRef) -> bool {
    !schema
        .fields()
        .iter()
        .any(|f| has_dictionary(f.data_type()))
}

fn has_dictionary(data_type: &DataType) -> bool {
    match data_type {
        DataType::Dictionary(..) => true,
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => has_dictionary(f.data_type()),
        DataType::Struct(fields) => fields.iter().any(|f| has_dictionary(f.data_type())),
        DataType::Union(fields, _) => fields.iter().any(|(_, f)| has_dictionary(f.data_type())),
        DataType::RunEndEncoded(_, values) => has_dictionary(values.data_type()),
        _ => false,
    }
}

/// Cuts a file whose bytes are `extents` (in order) and whose writes are `written`
/// into at most `parts` parts of about equal bytes; `None` when it cannot be cut in
/// two (too few writes, or writes that do not add up to the extents).
pub(crate) fn cut(
    extents: &[Extent],
    written: &Arc<[Written]>,
    segments: &[Segment],
    parts: usize,
) -> Option<Vec<Part>> {
    let total: u64 = written.iter().map(|w| w.len).sum();
    if parts < 2 || total != extents.iter().map(|e| e.len).sum::<u64>() {
        return None;
    }
    // starts[i]: where write i begins in the bytes of all writes.
    let starts: Vec<u64> = written
        .iter()
        .scan(0, |at, w| {
            let start = *at;
            *at += w.len;
            Some(start)
        })
        .collect();
    // A part begins at a write after the first and before the end marker.
    let last_cut = written.len().checked_sub(2)?;
    let mut cuts = Vec::new();
    for k in 1..parts as u64 {
        let target = total / parts as u64 * k;
        let from = cuts.last().map_or(1, |&c| c + 1);
        let Some(cut) = (from..=last_cut).find(|&i| starts[i] >= target) else {
            break;
        };
        cuts.push(cut);
    }
    if cuts.is_empty() {
        return None;
    }
    let mut bounds = vec![0];
    bounds.extend(&cuts);
    bounds.push(written.len());
    let parts = bounds
        .windows(2)
        .map(|w| {
            let (first, end) = (w[0], w[1]);
            let from = starts[first];
            let to = starts.get(end).copied().unwrap_or(total);
            Part {
                extents: range_of(extents, from, to).into(),
                written: written[first..end].into(),
                segment: (first > 0).then(|| segment_of(segments, first)).flatten(),
                open_ended: end < written.len(),
                first_batch: first as u64,
            }
        })
        .collect();
    Some(parts)
}

/// The schema of the segment write `write` is in.
fn segment_of(segments: &[Segment], write: usize) -> Option<SchemaRef> {
    segments
        .iter()
        .rev()
        .find(|s| s.first_write <= write)
        .map(|s| Arc::clone(&s.schema))
}

/// Bytes `from..to` of the bytes of `extents` read one after the other, as extents
/// of the file.
fn range_of(extents: &[Extent], from: u64, to: u64) -> Vec<Extent> {
    let mut out = Vec::new();
    let mut at = 0;
    for e in extents {
        let (start, end) = (at.max(from), (at + e.len).min(to));
        if start < end {
            out.push(Extent {
                offset: e.offset + (start - at),
                len: end - start,
            });
        }
        at += e.len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::{Field, Schema};

    fn writes(lens: &[u64]) -> Arc<[Written]> {
        lens.iter().map(|&len| Written { len, hash: 0 }).collect()
    }

    #[test]
    fn a_range_maps_onto_the_extents_it_crosses() {
        let extents = [
            Extent { offset: 0, len: 10 },
            Extent {
                offset: 100,
                len: 10,
            },
        ];
        assert_eq!(
            range_of(&extents, 5, 15),
            vec![
                Extent { offset: 5, len: 5 },
                Extent {
                    offset: 100,
                    len: 5
                }
            ]
        );
        assert_eq!(
            range_of(&extents, 10, 20),
            vec![Extent {
                offset: 100,
                len: 10
            }]
        );
    }

    #[test]
    fn parts_cover_every_write_once_and_only_the_last_ends_at_the_marker() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let segments = [
            Segment {
                first_write: 0,
                schema: Arc::clone(&schema),
            },
            Segment {
                first_write: 3,
                schema: Arc::new(Schema::new(vec![Field::new("b", DataType::Int64, true)])),
            },
        ];
        let written = writes(&[10, 10, 10, 10, 10, 10, 8]);
        let extents = [Extent { offset: 0, len: 68 }];
        for n in 2..10 {
            let parts = cut(&extents, &written, &segments, n).expect("cut");
            assert!(parts.len() <= n && parts.len() > 1);
            let writes: usize = parts.iter().map(|p| p.written.len()).sum();
            assert_eq!(writes, written.len());
            let bytes: u64 = parts
                .iter()
                .flat_map(|p| p.extents.iter())
                .map(|e| e.len)
                .sum();
            assert_eq!(bytes, 68);
            assert!(parts[0].segment.is_none());
            for (i, p) in parts.iter().enumerate() {
                assert_eq!(p.open_ended, i + 1 < parts.len());
                if i > 0 {
                    let expected = if p.first_batch >= 3 { "b" } else { "a" };
                    let segment = p.segment.as_ref().expect("segment");
                    assert_eq!(segment.field(0).name(), expected);
                }
            }
        }
        // The schema and one batch, then the marker: nothing to cut.
        assert!(cut(
            &[Extent { offset: 0, len: 18 }],
            &writes(&[10, 8]),
            &segments,
            2
        )
        .is_none());
        // Writes that do not add up to the file's bytes.
        assert!(cut(&extents, &writes(&[10, 10, 8]), &segments, 2).is_none());
    }

    #[test]
    fn a_dictionary_at_any_depth_keeps_a_file_whole() {
        let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let nested = DataType::List(Arc::new(Field::new("item", dict.clone(), true)));
        for (data_type, whole) in [(DataType::Utf8View, false), (dict, true), (nested, true)] {
            let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("a", data_type, true)]));
            assert_eq!(splittable(&schema), !whole);
        }
    }
}
