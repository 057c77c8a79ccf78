//! Checksums of what a spill file's writer wrote, checked as the file is read back.
//!
//! A spill file is read back by the process that wrote it, and its arrays are then
//! not validated again (`reader.rs`): validation costs a share of every read, and
//! the framing already refuses lengths that do not fit. A byte changed on disk or
//! in the page cache between the write and the read would pass both and be read as
//! another value, or as an offset past its buffer. So each write (one or more whole
//! messages, as the writer hands them to the file) is hashed as it is written
//! (xxh3, in memory: 16 bytes a write, no change to the file's format), and every
//! byte a reader of the file takes is hashed again: at the end of each write's bytes
//! the two must agree, or the read fails with [`crate::SpillError::Corrupt`].
//!
//! ```text
//!  writer: buffers of a write ─► xxh3 ─► Written { len, hash } (kept by the file)
//!  reader: every byte taken, in order ─► xxh3 until len bytes ─► == hash, or Corrupt
//! ```

use std::sync::Arc;

use arrow_buffer::Buffer;
use xxhash_rust::xxh3::Xxh3;

/// One write of a spill file: its bytes and their hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    pub(crate) len: u64,
    pub(crate) hash: u64,
}

impl Written {
    /// The write of `buffers`, one after the other.
    pub(crate) fn of(buffers: &[Buffer]) -> Self {
        let mut hasher = Xxh3::new();
        let mut len = 0;
        for buffer in buffers {
            hasher.update(buffer.as_slice());
            len += buffer.len() as u64;
        }
        Self {
            len,
            hash: hasher.digest(),
        }
    }
}

/// Checks the bytes a reader takes, in order, against the writes of its file.
pub(crate) struct Verifier {
    writes: Arc<[Written]>,
    /// The write the next byte belongs to, and its bytes hashed so far.
    index: usize,
    done: u64,
    hasher: Xxh3,
}

impl Verifier {
    /// A check of the bytes of `writes`, from the first.
    pub(crate) fn new(writes: Arc<[Written]>) -> Self {
        Self {
            writes,
            index: 0,
            done: 0,
            hasher: Xxh3::new(),
        }
    }

    /// Whether some bytes of the current write were taken and not all.
    pub(crate) fn inside_write(&self) -> bool {
        self.done > 0
    }

    /// Hashes `bytes`, the next the reader took; an error naming the write whose
    /// bytes hash to another value than when it was written, or bytes past the
    /// last write.
    pub(crate) fn consumed(&mut self, mut bytes: &[u8]) -> Result<(), String> {
        while !bytes.is_empty() {
            let Some(write) = self.writes.get(self.index) else {
                return Err("bytes past what was written".to_owned());
            };
            let left = usize::try_from(write.len - self.done).unwrap_or(usize::MAX);
            let (now, rest) = bytes.split_at(left.min(bytes.len()));
            self.hasher.update(now);
            self.done += now.len() as u64;
            bytes = rest;
            if self.done == write.len {
                if self.hasher.digest() != write.hash {
                    return Err(format!(
                        "checksum mismatch: write {} of the file ({} bytes) reads back \
                         otherwise than it was written",
                        self.index + 1,
                        write.len
                    ));
                }
                self.hasher.reset();
                self.index += 1;
                self.done = 0;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_taken_in_any_pieces_check_against_the_writes() {
        let first = [
            Buffer::from_vec(vec![1u8; 10]),
            Buffer::from_vec(vec![2u8; 6]),
        ];
        let second = [Buffer::from_vec(vec![3u8; 5])];
        let writes: Arc<[Written]> = vec![Written::of(&first), Written::of(&second)].into();
        let bytes: Vec<u8> = first
            .iter()
            .chain(&second)
            .flat_map(|b| b.as_slice().to_vec())
            .collect();
        for cut in [1, 4, 7, 16, 21] {
            let mut v = Verifier::new(Arc::clone(&writes));
            for piece in bytes.chunks(cut) {
                v.consumed(piece).unwrap();
            }
            assert_eq!(v.index, 2, "every write checked, in pieces of {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[18] ^= 0x10;
        let mut v = Verifier::new(Arc::clone(&writes));
        v.consumed(&flipped[..16]).unwrap();
        let err = v.consumed(&flipped[16..]).unwrap_err();
        assert!(err.contains("write 2 of the file (5 bytes)"), "{err}");
        let mut v = Verifier::new(writes);
        assert!(v.consumed(&[bytes.clone(), vec![0]].concat()).is_err());
    }
}
