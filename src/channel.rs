//! The output channel: batches on their way to the caller, reserved from the
//! join's pool from the moment they are assembled until the caller takes them.
//!
//! ```text
//!  worker ─ pieces ─► OutputSink (assembling: reserved) ─► channel (reserved) ─► JoinStream::next
//!                       └── reserve_assembling ──────────┴── OutputGate ◄── release ─┘
//! ```
//!
//! Output batches are memory the join holds like any other: a batch of 8192 rows of
//! 1.2 KB is 10 MB, and a channel of four of them with one being assembled per worker
//! took a join under a small limit far past it in RSS. The [`OutputGate`] counts
//! every byte of them in the pool and caps what is in flight at once
//! ([`OutputGate::cap_bytes`]): a worker that would exceed it, or that the pool
//! refuses, waits for the caller to take a batch. One that finds the channel empty
//! never waits (nothing would wake it): what it has assembled exists already, and is
//! counted even past the limit — at most a batch's bytes per worker, which the sink
//! keeps to a piece of the limit (`JoinPlan::piece_bytes`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use arrow_array::RecordBatch;
use crossbeam::channel::{bounded, Receiver, Sender};
use spilljoin_memory::{MemoryConsumer, MemoryPool, MemoryReservation};

use crate::batches::lock;
use crate::error::{JoinError, Result};

/// What goes through the channel: a batch and the bytes reserved for it.
pub(crate) type Sent = Result<(RecordBatch, usize)>;

/// How long a worker waiting for the caller sleeps before it looks again whether
/// the join was cancelled.
const GATE_WAIT: Duration = Duration::from_millis(50);

/// The share of the limit output batches may take at once, in flight and being
/// assembled: a quarter. Each worker assembles a batch of up to a piece of the
/// limit (`JoinPlan::piece_bytes`, a sixteenth of it over the workers), so the
/// channel holds about three batches a worker beside them. The caller that takes
/// them mostly runs when a worker waits (the workers keep every core busy): with an
/// eighth the channel held one batch a worker, and workers waited for the caller
/// at nearly every batch (SF1 every column at 5%: 8,000 waits of 80 µs, a fifth
/// of the workers' time in the spilled pairs). With a quarter they did not wait.
pub(crate) const IN_FLIGHT_SHARE: usize = 4;

/// Counts the output batches in flight against the pool and a cap.
#[derive(Debug)]
pub(crate) struct OutputGate {
    state: Mutex<GateState>,
    /// Signalled when the caller takes a batch.
    taken: Condvar,
    cap_bytes: usize,
    cancel: Arc<AtomicBool>,
}

#[derive(Debug)]
struct GateState {
    /// Holds `channel_bytes + assembling_bytes`.
    reservation: MemoryReservation,
    /// Bytes of batches sent and not yet taken.
    channel_bytes: usize,
    /// Bytes of pieces the sinks are assembling into batches.
    assembling_bytes: usize,
    /// Workers waiting in [`OutputGate::reserve_assembling`]: the caller wakes them
    /// only if there are any (a wake is a system call per batch taken).
    waiting: usize,
}

impl OutputGate {
    /// A gate reserving from `pool`; `cancel` ends a wait.
    pub fn new(pool: &Arc<dyn MemoryPool>, cancel: Arc<AtomicBool>) -> Self {
        let reservation = MemoryConsumer::new("spilljoin output")
            .with_can_spill(false)
            .register(pool);
        let limit = pool.limit().bytes();
        Self {
            state: Mutex::new(GateState {
                reservation,
                channel_bytes: 0,
                assembling_bytes: 0,
                waiting: 0,
            }),
            taken: Condvar::new(),
            cap_bytes: limit / IN_FLIGHT_SHARE,
            cancel,
        }
    }

    /// The most bytes of output in flight and being assembled at once (unless the
    /// channel is empty).
    #[cfg(test)]
    pub fn cap_bytes(&self) -> usize {
        self.cap_bytes
    }

    /// Reserves `bytes` of pieces being assembled, waiting while the cap or the
    /// pool refuses them and the channel holds batches the caller will take.
    ///
    /// # Errors
    /// [`JoinError::Cancelled`] if the join is cancelled while it waits.
    pub fn reserve_assembling(&self, bytes: usize) -> Result<()> {
        let mut state = lock(&self.state);
        loop {
            let in_flight = state.channel_bytes + state.assembling_bytes;
            let fits = in_flight + bytes <= self.cap_bytes;
            if fits && state.reservation.try_grow(bytes).is_ok() {
                break;
            }
            if state.channel_bytes == 0 {
                // Nothing to wait for: counted all the same.
                state.reservation.grow(bytes);
                break;
            }
            if self.cancel.load(Ordering::Relaxed) {
                return Err(JoinError::Cancelled);
            }
            state.waiting += 1;
            state = self
                .taken
                .wait_timeout(state, GATE_WAIT)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
            state.waiting -= 1;
        }
        state.assembling_bytes += bytes;
        Ok(())
    }

    /// Moves `assembled` bytes of pieces into the channel as a batch of `bytes`
    /// (its pieces were reserved; a copy of them may take more or less).
    pub fn to_channel(&self, assembled: usize, bytes: usize) {
        let mut state = lock(&self.state);
        let assembled = assembled.min(state.assembling_bytes);
        state.assembling_bytes -= assembled;
        if bytes > assembled {
            // (The batch exists already.)
            state.reservation.grow(bytes - assembled);
        } else {
            state.reservation.shrink(assembled - bytes);
        }
        state.channel_bytes += bytes;
    }

    /// Gives back `bytes` of pieces assembled but not sent (a sink dropped).
    pub fn unassemble(&self, bytes: usize) {
        let mut state = lock(&self.state);
        let bytes = bytes.min(state.assembling_bytes);
        state.assembling_bytes -= bytes;
        state.reservation.shrink(bytes);
        let waiting = state.waiting > 0;
        drop(state);
        if waiting {
            self.taken.notify_all();
        }
    }

    /// The caller took a batch of `bytes`.
    pub fn release(&self, bytes: usize) {
        let mut state = lock(&self.state);
        let bytes = bytes.min(state.channel_bytes);
        state.channel_bytes -= bytes;
        state.reservation.shrink(bytes);
        let waiting = state.waiting > 0;
        drop(state);
        if waiting {
            self.taken.notify_all();
        }
    }

    /// The channel was dropped with what it held: nothing in it is held any more.
    pub fn clear_channel(&self) {
        let mut state = lock(&self.state);
        let bytes = std::mem::take(&mut state.channel_bytes);
        state.reservation.shrink(bytes);
        let waiting = state.waiting > 0;
        drop(state);
        if waiting {
            self.taken.notify_all();
        }
    }
}

/// The sending side of the output channel, with its gate.
#[derive(Debug, Clone)]
pub(crate) struct OutputChannel {
    pub sender: Sender<Sent>,
    pub gate: Arc<OutputGate>,
}

/// A channel of `capacity` batches reserving from `pool`, and its receiving side.
pub(crate) fn output_channel(
    capacity: usize,
    pool: &Arc<dyn MemoryPool>,
    cancel: Arc<AtomicBool>,
) -> (OutputChannel, Receiver<Sent>) {
    let (sender, receiver) = bounded(capacity);
    let gate = Arc::new(OutputGate::new(pool, cancel));
    (OutputChannel { sender, gate }, receiver)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spilljoin_memory::GreedyMemoryPool;

    #[test]
    fn a_full_gate_waits_for_the_caller_and_an_empty_channel_never_waits() -> Result<()> {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(4000));
        let gate = Arc::new(OutputGate::new(&pool, Arc::new(AtomicBool::new(false))));
        assert_eq!(gate.cap_bytes(), 1000);
        // An empty channel: past the cap, counted all the same.
        gate.reserve_assembling(1500)?;
        gate.to_channel(1500, 1400);
        assert_eq!(pool.reserved(), 1400);
        // A batch in the channel: the next waits until the caller takes it.
        let waiter = {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || gate.reserve_assembling(600))
        };
        std::thread::sleep(Duration::from_millis(120));
        assert!(!waiter.is_finished());
        gate.release(1400);
        waiter.join().map_err(|_| JoinError::Cancelled)??;
        assert_eq!(pool.reserved(), 600);
        gate.unassemble(600);
        assert_eq!(pool.reserved(), 0);
        Ok(())
    }

    /// Found in review: pieces of a few rows each count more than the batch made of
    /// them (each piece its columns' overhead); the leftover stayed reserved until
    /// the sink finished, a large share of a small limit. And that overhead made the
    /// rows look wide enough to shrink the batches.
    #[test]
    fn a_sink_of_small_pieces_holds_no_more_than_its_batches() -> Result<()> {
        use arrow_array::{ArrayRef, Int64Array};
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
        let (channel, receiver) = output_channel(4, &pool, Arc::new(AtomicBool::new(false)));
        let gate = Arc::clone(&channel.gate);
        let columns: Vec<(String, ArrayRef)> = (0..10)
            .map(|i| {
                let values: Int64Array = (0..1000).map(Some).collect();
                (format!("c{i}"), Arc::new(values) as ArrayRef)
            })
            .collect();
        let batch = RecordBatch::try_from_iter(columns).map_err(JoinError::Arrow)?;
        let max_batch_bytes = 64 << 10;
        let mut sink =
            crate::output::OutputSink::new(batch.schema(), 100, max_batch_bytes, channel);
        let (mut most, mut sizes) = (0, Vec::new());
        for row in 0..batch.num_rows() {
            sink.push(batch.slice(row, 1))?;
            most = most.max(pool.reserved());
            for (sent, bytes) in receiver.try_iter().collect::<Result<Vec<_>>>()? {
                sizes.push(sent.num_rows());
                gate.release(bytes);
            }
        }
        sink.finish()?;
        for (sent, bytes) in receiver.try_iter().collect::<Result<Vec<_>>>()? {
            sizes.push(sent.num_rows());
            gate.release(bytes);
        }
        // Rows of 80 bytes make whole batches: a piece's per-column overhead does
        // not count as row width (a one-row piece made batches of 91 rows).
        assert_eq!(sizes, vec![100; 10]);
        // A batch of 100 rows being assembled: 100 pieces of 1 row, 8 bytes and 64
        // of overhead a column each, and a sent batch not yet taken.
        assert!(
            most <= 2 * 100 * (8 + 64) * 10,
            "{most} bytes reserved at most"
        );
        assert_eq!(pool.reserved(), 0);
        Ok(())
    }

    /// A piece larger than a batch is passed on in equal slices of at most a batch,
    /// none copied: cut into whole batches and a remainder, the remainder (under
    /// half a batch) was copied into the coalescer and again into the next batch.
    #[test]
    fn a_large_piece_passes_in_equal_slices_sharing_its_buffers() -> Result<()> {
        use arrow_array::{cast::AsArray, ArrayRef, Int64Array};
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
        let (channel, receiver) = output_channel(8, &pool, Arc::new(AtomicBool::new(false)));
        let gate = Arc::clone(&channel.gate);
        let values: Int64Array = (0..250).map(Some).collect();
        let batch = RecordBatch::try_from_iter([("v", Arc::new(values) as ArrayRef)])?;
        let source = batch.column(0).to_data().buffers()[0].as_ptr();
        let mut sink = crate::output::OutputSink::new(batch.schema(), 100, 1 << 20, channel);
        for _ in 0..2 {
            sink.push(batch.clone())?;
        }
        sink.finish()?;
        let (mut sizes, mut shared, mut got) = (Vec::new(), 0, Vec::new());
        for (sent, bytes) in receiver.try_iter().collect::<Result<Vec<_>>>()? {
            sizes.push(sent.num_rows());
            let column = sent
                .column(0)
                .as_primitive::<arrow_array::types::Int64Type>();
            let start = column.values().inner().as_ptr();
            // A slice of the piece starts inside the piece's own values buffer.
            shared += usize::from(start >= source && start < source.wrapping_add(250 * 8));
            got.extend(column.values().iter().copied());
            gate.release(bytes);
        }
        assert_eq!(sizes, vec![83, 83, 84, 83, 83, 84]);
        assert_eq!(shared, 6, "every slice shares the piece's buffer");
        let want: Vec<i64> = (0..250).chain(0..250).collect();
        assert_eq!(got, want);
        assert_eq!(pool.reserved(), 0);
        Ok(())
    }

    /// A probe of `p` (0, 1, ...) and the string column `s`, a build of `b` (the values
    /// of `build`), and the layout of their inner join (build on the right).
    fn pair_sides(
        strings: arrow_array::ArrayRef,
        build: std::ops::Range<i64>,
    ) -> Result<(RecordBatch, RecordBatch, crate::output::OutputLayout)> {
        use arrow_array::{ArrayRef, Int64Array};
        let n = i64::try_from(strings.len()).unwrap_or(i64::MAX);
        let probe = RecordBatch::try_from_iter([
            (
                "p",
                Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef,
            ),
            ("s", strings),
        ])?;
        let build = RecordBatch::try_from_iter([(
            "b",
            Arc::new(Int64Array::from_iter_values(build)) as ArrayRef,
        )])?;
        let layout = crate::output::OutputLayout::new(
            crate::JoinType::Inner,
            crate::Side::Right,
            &probe.schema(),
            &build.schema(),
            None,
        )?;
        Ok((probe, build, layout))
    }

    /// Matched pairs pushed a few at a time are gathered into whole batches of the
    /// batch size (the last one short) holding what `take` makes of them, and leave
    /// nothing reserved; rows wider than a batch's bytes make batches of fewer rows.
    #[test]
    fn pairs_pushed_in_small_pieces_make_whole_batches_as_take_would() -> Result<()> {
        use crate::output::OutputSink;
        use arrow_array::{ArrayRef, StringArray, UInt32Array};
        let text = (0..500).map(|i| "x".repeat(i % 50));
        let strings = Arc::new(StringArray::from_iter_values(text)) as ArrayRef;
        let (probe, build, layout) = pair_sides(strings, 1000..1200)?;
        let (p, b): (Vec<u32>, Vec<u32>) =
            (0..1000u32).map(|k| ((k * 7) % 500, (k * 3) % 200)).unzip();
        let want = layout.gather(
            p.len(),
            Some((&probe, &UInt32Array::from(p.clone()))),
            Some((&build, &UInt32Array::from(b.clone()))),
            None,
        )?;
        for max_batch_bytes in [1 << 20, 2000] {
            let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
            let (channel, receiver) = output_channel(4, &pool, Arc::new(AtomicBool::new(false)));
            let gate = Arc::clone(&channel.gate);
            let mut sink =
                OutputSink::new(Arc::clone(&layout.schema), 64, max_batch_bytes, channel)
                    .with_pairs(&layout);
            let mut sent = Vec::new();
            for (p, b) in p.chunks(13).zip(b.chunks(13)) {
                let (p, b) = (UInt32Array::from(p.to_vec()), UInt32Array::from(b.to_vec()));
                sink.push_pairs(&layout, (&probe, &p), (&build, &b))?;
                for (batch, bytes) in receiver.try_iter().collect::<Result<Vec<_>>>()? {
                    gate.release(bytes);
                    sent.push((batch, bytes));
                }
            }
            sink.finish()?;
            for (batch, bytes) in receiver.try_iter().collect::<Result<Vec<_>>>()? {
                gate.release(bytes);
                sent.push((batch, bytes));
            }
            assert_eq!(pool.reserved(), 0);
            let batches: Vec<RecordBatch> = sent.iter().map(|(b, _)| b.clone()).collect();
            let got = arrow_select::concat::concat_batches(&layout.schema, &batches)?;
            assert_eq!(got, want, "max {max_batch_bytes}");
            let rows: Vec<usize> = batches.iter().map(RecordBatch::num_rows).collect();
            if max_batch_bytes == 1 << 20 {
                assert!(rows[..rows.len() - 1].iter().all(|&r| r == 64), "{rows:?}");
            } else {
                // About 40 bytes a row: fewer than 64 a batch, none over the bytes.
                assert!(rows.iter().all(|&r| r < 64), "{rows:?}");
                assert!(sent
                    .iter()
                    .all(|(_, bytes)| *bytes <= max_batch_bytes + 200));
            }
        }
        Ok(())
    }

    /// Pieces of pairs of half a batch or more of wide rows are taken, not copied,
    /// though a batch of them is far fewer rows than half the batch size and rows
    /// wait in the pair buffer: a taken view column shares the probe's strings.
    #[test]
    fn pieces_of_half_a_batch_of_wide_rows_are_taken_not_copied() -> Result<()> {
        use crate::output::OutputSink;
        use arrow_array::{cast::AsArray, ArrayRef, StringViewArray, UInt32Array};
        let text = (0..300).map(|i| format!("{i:040}"));
        let views = Arc::new(StringViewArray::from_iter_values(text)) as ArrayRef;
        let (probe, build, layout) = pair_sides(views, 1000..1100)?;
        let strings = probe.column(1).as_string_view().data_buffers()[0].clone();
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
        let (channel, receiver) = output_channel(64, &pool, Arc::new(AtomicBool::new(false)));
        let gate = Arc::clone(&channel.gate);
        // About 70 bytes a row gathered: batches of about 20 rows, against 64.
        let mut sink =
            OutputSink::new(Arc::clone(&layout.schema), 64, 1500, channel).with_pairs(&layout);
        let mut want = Vec::new();
        for (start, len) in [(0, 13), (13, 13), (26, 12), (38, 12), (50, 12), (62, 7)] {
            let p: Vec<u32> = (start..start + len).collect();
            let b: Vec<u32> = p.iter().map(|r| r % 100).collect();
            want.extend(
                p.iter()
                    .zip(&b)
                    .map(|(&p, &b)| (i64::from(p), 1000 + i64::from(b))),
            );
            let (p, b) = (UInt32Array::from(p), UInt32Array::from(b));
            sink.push_pairs(&layout, (&probe, &p), (&build, &b))?;
        }
        sink.finish()?;
        let (mut got, mut taken) = (Vec::new(), 0);
        for (batch, bytes) in receiver.try_iter().collect::<Result<Vec<_>>>()? {
            gate.release(bytes);
            let (p, s, b) = (
                batch
                    .column(0)
                    .as_primitive::<arrow_array::types::Int64Type>(),
                batch.column(1).as_string_view(),
                batch
                    .column(2)
                    .as_primitive::<arrow_array::types::Int64Type>(),
            );
            taken += usize::from(
                s.data_buffers()
                    .iter()
                    .any(|d| d.as_ptr() == strings.as_ptr()),
            );
            for k in 0..batch.num_rows() {
                assert_eq!(s.value(k), format!("{:040}", p.value(k)));
                got.push((p.value(k), b.value(k)));
            }
        }
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
        assert_eq!(
            taken, 3,
            "the three pieces of 12 rows share the probe's strings"
        );
        assert_eq!(pool.reserved(), 0);
        Ok(())
    }

    /// Found in review: pairs of an output of no columns (an empty projection) must
    /// still count as rows, a few at a time too.
    #[test]
    fn pairs_of_no_columns_count_as_rows() -> Result<()> {
        use crate::output::{OutputLayout, OutputSink};
        use arrow_array::{ArrayRef, Int64Array, UInt32Array};
        let side = |n: i64| {
            RecordBatch::try_from_iter([(
                "k",
                Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef,
            )])
        };
        let (probe, build) = (side(50)?, side(20)?);
        let layout = OutputLayout::new(
            crate::JoinType::Inner,
            crate::Side::Right,
            &probe.schema(),
            &build.schema(),
            Some(&[]),
        )?;
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
        let (channel, receiver) = output_channel(4, &pool, Arc::new(AtomicBool::new(false)));
        let gate = Arc::clone(&channel.gate);
        let mut sink =
            OutputSink::new(Arc::clone(&layout.schema), 64, 1 << 20, channel).with_pairs(&layout);
        for k in 0..10u32 {
            let rows = UInt32Array::from(vec![k; 3]);
            sink.push_pairs(&layout, (&probe, &rows), (&build, &rows))?;
        }
        sink.finish()?;
        let mut rows = 0;
        for (batch, bytes) in receiver.try_iter().collect::<Result<Vec<_>>>()? {
            gate.release(bytes);
            rows += batch.num_rows();
        }
        assert_eq!((rows, sink.rows()), (30, 30));
        assert_eq!(pool.reserved(), 0);
        Ok(())
    }

    #[test]
    fn a_cancelled_join_stops_waiting() -> Result<()> {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(4000));
        let cancel = Arc::new(AtomicBool::new(false));
        let gate = OutputGate::new(&pool, Arc::clone(&cancel));
        gate.reserve_assembling(900)?;
        gate.to_channel(900, 900);
        cancel.store(true, Ordering::Relaxed);
        assert!(matches!(
            gate.reserve_assembling(900),
            Err(JoinError::Cancelled)
        ));
        gate.clear_channel();
        assert_eq!(pool.reserved(), 0);
        Ok(())
    }
}
