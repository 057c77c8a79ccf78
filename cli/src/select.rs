//! `--select`: the output columns, by name, in order.
//!
//! A name is `NAME` (if only one output side has it), `left.NAME` or `right.NAME`,
//! or `mark` for a mark join's mark column. Selected columns keep the names they
//! have in the full output: `side.NAME` for a name both inputs have when the output
//! carries both sides.

use anyhow::{bail, Result};
use arrow_schema::{Field, Schema};
use spilljoin::{JoinType, Side, MARK_COLUMN};

use super::failure::Kind;
use super::suggest::{did_you_mean, no_such_column};

/// A column the user named for the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selected {
    /// A column of one input.
    Column {
        /// The input.
        side: Side,
        /// The column's name in that input.
        name: String,
    },
    /// The `mark` column of a mark join.
    Mark,
}

/// Resolves `--select` names against the full schemas of the inputs.
///
/// # Errors
/// A definition failure: an unknown or ambiguous name, or a side the join type does
/// not output.
pub fn resolve(
    names: &[String],
    join_type: JoinType,
    left: &Schema,
    right: &Schema,
) -> Result<Vec<Selected>> {
    names
        .iter()
        .map(|raw| resolve_one(raw, join_type, left, right))
        .collect::<Result<Vec<_>>>()
        .map_err(|e| match super::failure::kind_of(&e) {
            super::failure::Kind::Internal => {
                e.context(Kind::Definition.context("invalid --select"))
            }
            _ => e,
        })
}

fn resolve_one(raw: &str, join_type: JoinType, left: &Schema, right: &Schema) -> Result<Selected> {
    let sides = join_type.output_sides();
    let (side, name) = match raw.split_once('.') {
        Some(("left", name)) => (Some(Side::Left), name),
        Some(("right", name)) => (Some(Side::Right), name),
        _ => (None, raw),
    };
    // In a mark join, `mark` is the mark column (`left.mark` a left column).
    if side.is_none() && name == MARK_COLUMN && join_type == JoinType::LeftMark {
        return Ok(Selected::Mark);
    }
    let in_left = left.index_of(name).is_ok() && sides.contains(&Side::Left);
    let in_right = right.index_of(name).is_ok() && sides.contains(&Side::Right);
    let side = match (side, in_left, in_right) {
        (Some(s), _, _) if !sides.contains(&s) => {
            bail!("--select {raw}: this join type outputs no {s} columns")
        }
        (Some(Side::Left), false, _) => {
            return Err(no_such_column(Side::Left, name, left).context(format!("--select {raw}")));
        }
        (Some(Side::Right), _, false) => {
            return Err(no_such_column(Side::Right, name, right).context(format!("--select {raw}")));
        }
        (Some(s), _, _) => s,
        (None, true, true) => {
            bail!("--select {raw} is on both sides: write left.{name} or right.{name}")
        }
        (None, true, false) => Side::Left,
        (None, false, true) => Side::Right,
        (None, false, false) => {
            let mut names: Vec<&str> = Vec::new();
            for (side, schema) in [(Side::Left, left), (Side::Right, right)] {
                if sides.contains(&side) {
                    names.extend(schema.fields().iter().map(|f| f.name().as_str()));
                }
            }
            if join_type == JoinType::LeftMark {
                names.push(MARK_COLUMN);
            }
            bail!(
                "--select {raw}: no such output column{}",
                did_you_mean(name, names)
            )
        }
    };
    Ok(Selected::Column {
        side,
        name: name.to_string(),
    })
}

/// The output projection (indices into the join's full output over the projected
/// `left` and `right` schemas) for the selection.
///
/// # Errors
/// A selected column the projected schemas lack (a bug in the projection).
pub fn projection(
    selected: &[Selected],
    left: &Schema,
    right: &Schema,
    sides: &[Side],
) -> Result<Vec<usize>> {
    selected
        .iter()
        .map(|s| {
            let mut offset = 0;
            for &side in sides {
                let schema = if side == Side::Left { left } else { right };
                match s {
                    Selected::Column { side: s, name } if *s == side => {
                        return Ok(offset + schema.index_of(name)?);
                    }
                    _ => offset += schema.fields().len(),
                }
            }
            match s {
                // The mark column comes after every input column.
                Selected::Mark => Ok(offset),
                Selected::Column { name, .. } => bail!("--select {name}: not an output column"),
            }
        })
        .collect()
}

/// The schema of a selected output: the join's, with each column named as in the
/// full output of `left` and `right`.
pub fn output_schema(
    joined: &Schema,
    selected: &[Selected],
    sides: &[Side],
    left: &Schema,
    right: &Schema,
) -> Schema {
    let fields: Vec<Field> = joined
        .fields()
        .iter()
        .zip(selected)
        .map(|(field, s)| {
            let name = match s {
                Selected::Mark => MARK_COLUMN.to_string(),
                Selected::Column { side, name } => {
                    let shared = sides.len() == 2
                        && left.index_of(name).is_ok()
                        && right.index_of(name).is_ok();
                    if shared {
                        format!("{side}.{name}")
                    } else {
                        name.clone()
                    }
                }
            };
            field.as_ref().clone().with_name(name)
        })
        .collect();
    Schema::new_with_metadata(fields, joined.metadata().clone())
}
