//! The join's error type.

use std::path::PathBuf;

use arrow_schema::{ArrowError, DataType};
use spilljoin_memory::MemoryError;
use spilljoin_spill::SpillError;

/// Which input of the user's join an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The left input of the join definition.
    Left,
    /// The right input of the join definition.
    Right,
}

impl Side {
    /// The other side.
    pub fn other(self) -> Side {
        match self {
            Side::Left => Side::Right,
            Side::Right => Side::Left,
        }
    }
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Left => "left",
            Side::Right => "right",
        })
    }
}

/// Everything a join can fail with.
///
/// Operating errors (input, memory, disk) are values of this type; programmer errors
/// are panics. No panic crosses the public API on account of input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The memory pool refused a reservation that the join could not do without.
    #[error(
        "resources exhausted: {consumer} needs {requested_bytes} more bytes, \
         {available_bytes} available"
    )]
    ResourcesExhausted {
        /// The consumer whose reservation failed.
        consumer: String,
        /// The bytes it asked for.
        requested_bytes: usize,
        /// The bytes the pool could still give it.
        available_bytes: usize,
        /// The pool's error, which may name the largest consumers.
        #[source]
        source: MemoryError,
    },
    /// Writing or reading a spill file failed.
    #[error("spill failed")]
    Spill(#[from] SpillError),
    /// An Arrow kernel failed.
    #[error("arrow error: {0}")]
    Arrow(#[from] ArrowError),
    /// An input produced an error.
    #[error("reading the {side} input failed")]
    Input {
        /// The input that failed.
        side: Side,
        /// What it reported.
        #[source]
        source: ArrowError,
    },
    /// An input batch does not have the schema the join was defined with.
    #[error("a {side} input batch has schema {found}, the join was defined with {expected}")]
    SchemaMismatch {
        /// The input.
        side: Side,
        /// The schema given when the join was defined.
        expected: String,
        /// The schema of the batch.
        found: String,
    },
    /// A key column does not exist.
    #[error("no column {name:?} in the {side} input (columns: {available})")]
    NoSuchColumn {
        /// The input.
        side: Side,
        /// The missing column.
        name: String,
        /// The columns the input has, comma-separated.
        available: String,
    },
    /// The two columns of a key pair have types that cannot be compared.
    #[error(
        "key types differ: left {left_column} is {left_type}, right {right_column} is {right_type}"
    )]
    KeyTypeMismatch {
        /// The left key column.
        left_column: String,
        /// Its type.
        left_type: DataType,
        /// The right key column.
        right_column: String,
        /// Its type.
        right_type: DataType,
    },
    /// A key column has a type that cannot be a join key.
    #[error(
        "column {column} of the {side} input has type {data_type}, which cannot be a join key"
    )]
    UnsupportedKeyType {
        /// The input.
        side: Side,
        /// The column.
        column: String,
        /// Its type.
        data_type: DataType,
    },
    /// The residual filter failed or returned something other than booleans.
    #[error("the join filter failed: {message}")]
    Filter {
        /// What went wrong.
        message: String,
        /// The Arrow error behind it, if any.
        #[source]
        source: Option<ArrowError>,
    },
    /// The join was defined in a way that cannot run.
    #[error("invalid join: {0}")]
    InvalidJoin(String),
    /// The join was stopped before it finished (its output was dropped, or it was
    /// cancelled).
    #[error("the join was cancelled")]
    Cancelled,
    /// A prepared build was attached to a join it was not prepared for.
    #[error("the prepared build does not fit this join: {0}")]
    PreparedBuildMismatch(String),
    /// A shared build (see `BuildCache`) failed; every request that waited for it
    /// gets this error.
    #[error("the shared build failed: {0}")]
    SharedBuildFailed(std::sync::Arc<JoinError>),
    /// A broken internal invariant: a bug in spilljoin, never a fault of the input
    /// or of the join's definition (the command line exits with 1 for it, as for a
    /// panic).
    #[error("internal error (a bug in spilljoin): {0}")]
    Internal(String),
    /// A worker thread panicked; this is a bug in spilljoin.
    #[error("internal error: a join worker panicked: {0}")]
    WorkerPanicked(String),
    /// A file could not be used.
    #[error("i/o error on {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl From<MemoryError> for JoinError {
    fn from(source: MemoryError) -> Self {
        match &source {
            MemoryError::ResourcesExhausted {
                consumer,
                requested_bytes,
                available_bytes,
                ..
            } => JoinError::ResourcesExhausted {
                consumer: consumer.clone(),
                requested_bytes: *requested_bytes,
                available_bytes: *available_bytes,
                source,
            },
            // `MemoryError` is non-exhaustive; a future kind is still a refusal.
            #[allow(unreachable_patterns)]
            _ => JoinError::ResourcesExhausted {
                consumer: source.consumer().to_string(),
                requested_bytes: source.requested_bytes(),
                available_bytes: 0,
                source,
            },
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = JoinError> = std::result::Result<T, E>;
