//! How a run fails: the kinds of failure, their exit codes, and the one line that
//! tells a person what happened.
//!
//! Errors travel as `anyhow::Error`. Where the command line knows what went wrong
//! (it could not open an input, or a column does not exist) it tags the error with a
//! [`Failure`] context; errors of the join engine are classified by their type
//! ([`JoinError`], [`SpillError`]); `sql` sorts DataFusion's errors into the same
//! kinds (`sql::diagnose`). The first tag found from the outside in decides
//! the kind, so `cannot write the output: i/o error` is an output failure even when
//! the cause is an `std::io::Error` like any other.
//!
//! | code | kind |
//! |---|---|
//! | 0 | success |
//! | 1 | internal error (a bug) |
//! | 2 | the command line cannot be parsed (clap) |
//! | 3 | the join or query is invalid: unknown column or table, key types, filter, selection, SQL |
//! | 4 | an input cannot be read: missing, unreadable, corrupt |
//! | 5 | the output (or `--metrics` file) cannot be written |
//! | 6 | spilling failed: spill dir, full disk, `--max-spill-size` reached |
//! | 7 | the memory limit is below what the join (or a query's operator) needs |
//! | 128+N | stopped by signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP) |

use std::fmt;

use spilljoin::spill::SpillError;
use spilljoin::JoinError;

/// What kind of failure ended a run; each has its own exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A bug: an internal error that no input should cause.
    Internal,
    /// The join as defined cannot run: a column that does not exist, key types that
    /// cannot be compared, a filter that does not parse or type-check, a bad
    /// selection or schema override.
    Definition,
    /// An input cannot be read: missing, unreadable, not of its format, corrupt.
    Input,
    /// The output or the metrics file cannot be written.
    Output,
    /// Spilling failed: the spill dir, a full disk, the spill quota.
    Spill,
    /// The memory limit is below what the join needs.
    Memory,
}

impl Kind {
    /// The process exit code.
    pub fn exit_code(self) -> i32 {
        match self {
            Kind::Internal => 1,
            Kind::Definition => 3,
            Kind::Input => 4,
            Kind::Output => 5,
            Kind::Spill => 6,
            Kind::Memory => 7,
        }
    }

    /// An error of this kind with `message`.
    pub fn error(self, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Failure::new(self, message))
    }

    /// A context of this kind, for `anyhow::Context::context`.
    pub fn context(self, message: impl Into<String>) -> Failure {
        Failure::new(self, message)
    }
}

/// The exit code of a command line that cannot be parsed (clap's own).
pub const EXIT_USAGE: i32 = 2;

/// The exit code of a run stopped by `signal`: 128 + its number, as shells report.
pub fn signal_exit_code(signal: i32) -> i32 {
    128 + signal
}

/// A message tagged with the kind of failure it reports.
#[derive(Debug, Clone)]
pub struct Failure {
    kind: Kind,
    message: String,
}

impl Failure {
    /// A failure of `kind`.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// The kind of `error`: its outermost [`Failure`] tag, else what its causes are.
pub fn kind_of(error: &anyhow::Error) -> Kind {
    if let Some(failure) = error.downcast_ref::<Failure>() {
        return failure.kind;
    }
    for cause in error.chain() {
        if let Some(failure) = cause.downcast_ref::<Failure>() {
            return failure.kind;
        }
        if let Some(e) = cause.downcast_ref::<JoinError>() {
            return join_error_kind(e);
        }
        if cause.downcast_ref::<SpillError>().is_some() {
            return Kind::Spill;
        }
    }
    Kind::Internal
}

/// The kind of an error of the join engine.
pub fn join_error_kind(e: &JoinError) -> Kind {
    match e {
        JoinError::ResourcesExhausted { .. } => Kind::Memory,
        JoinError::Spill(_) => Kind::Spill,
        JoinError::Input { .. } | JoinError::SchemaMismatch { .. } => Kind::Input,
        JoinError::NoSuchColumn { .. }
        | JoinError::KeyTypeMismatch { .. }
        | JoinError::UnsupportedKeyType { .. }
        | JoinError::Filter { .. }
        | JoinError::InvalidJoin(_) => Kind::Definition,
        // A broken invariant or a worker's panic is a bug, whatever the input.
        JoinError::Internal(_) | JoinError::WorkerPanicked(_) => Kind::Internal,
        // `Io` is a thread that could not be started.
        _ => Kind::Internal,
    }
}

/// The error and its causes on one line, outermost first. A cause whose text its
/// parent already includes is left out, and line breaks become spaces.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut message = String::new();
    let mut previous = String::new();
    for cause in e.chain() {
        // Arrow's wrapper of other errors adds only words.
        let text = cause.to_string().replace("External error: ", "");
        if !previous.is_empty() && previous.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
        previous = text;
    }
    message.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn the_outermost_tag_decides() {
        let io = std::io::Error::other("disk on fire");
        let e = anyhow::Error::new(io).context(Kind::Output.context("cannot write x"));
        assert_eq!(kind_of(&e), Kind::Output);
        assert_eq!(one_line(&e), "cannot write x: disk on fire");
        let e: anyhow::Error = JoinError::InvalidJoin("no".into()).into();
        assert_eq!(kind_of(&e), Kind::Definition);
        let e: anyhow::Error = JoinError::Internal("lost a writer".into()).into();
        assert_eq!(kind_of(&e), Kind::Internal);
        assert_eq!(Kind::Internal.exit_code(), 1);
        let e = Err::<(), _>(JoinError::Cancelled)
            .context("while joining")
            .unwrap_err();
        assert_eq!(kind_of(&e), Kind::Internal);
        assert_eq!(kind_of(&anyhow::anyhow!("what")), Kind::Internal);
    }
}
