//! spilljoin's errors as DataFusion's.
//!
//! An input's error (a sort below that ran out of memory, a corrupt Parquet file)
//! travels through the engine inside an `ArrowError::ExternalError` and comes out
//! as the `DataFusionError` it was, so the user sees which operator failed. The
//! engine's own refusal below its memory floor is `ResourcesExhausted`, named
//! `SpilljoinExec` so that it is not mistaken for another operator's.

use datafusion::common::DataFusionError;
use spilljoin::JoinError;

/// The DataFusion error for `error`.
pub(crate) fn to_datafusion(error: JoinError) -> DataFusionError {
    match error {
        JoinError::Input { source, side } => match unwrap_arrow(source) {
            Ok(inner) => inner,
            Err(source) => DataFusionError::External(Box::new(JoinError::Input { side, source })),
        },
        JoinError::Arrow(source) => match unwrap_arrow(source) {
            Ok(inner) => inner,
            Err(source) => DataFusionError::ArrowError(Box::new(source), None),
        },
        e @ JoinError::ResourcesExhausted { .. } => {
            DataFusionError::ResourcesExhausted(format!("SpilljoinExec: {}", chain(&e)))
        }
        JoinError::Cancelled => DataFusionError::Execution("SpilljoinExec: cancelled".into()),
        e => DataFusionError::Execution(format!("SpilljoinExec: {}", chain(&e))),
    }
}

/// The DataFusion error inside `error`, if it carries one.
fn unwrap_arrow(
    error: arrow_schema::ArrowError,
) -> Result<DataFusionError, arrow_schema::ArrowError> {
    match error {
        arrow_schema::ArrowError::ExternalError(inner) => match inner.downcast::<DataFusionError>()
        {
            Ok(e) => Ok(*e),
            Err(other) => Err(arrow_schema::ArrowError::ExternalError(other)),
        },
        other => Err(other),
    }
}

/// `error` and its sources, one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use spilljoin::Side;

    #[test]
    fn an_input_error_comes_back_as_it_was() {
        let inner = DataFusionError::ResourcesExhausted("SortExec: no memory".into());
        let e = JoinError::Input {
            side: Side::Left,
            source: arrow_schema::ArrowError::ExternalError(Box::new(inner)),
        };
        let back = to_datafusion(e);
        assert!(
            matches!(back, DataFusionError::ResourcesExhausted(ref m) if m == "SortExec: no memory")
        );
    }

    #[test]
    fn the_joins_own_errors_name_it() {
        let e = to_datafusion(JoinError::Internal("x".into()));
        assert!(e.to_string().contains("SpilljoinExec"), "{e}");
    }
}
