//! Join types, as the user names them and as the engine runs them.
//!
//! The user defines a join over a *left* and a *right* input ([`JoinType`]). The engine
//! only knows a *build* side (hashed into tables) and a *probe* side (streamed past
//! them). Planning resolves the one into the other once ([`JoinType::resolve`]); the
//! rest of the engine never says left or right.
//!
//! | `JoinType`   | output rows                                            | build = right      | build = left       |
//! |--------------|--------------------------------------------------------|--------------------|--------------------|
//! | `Inner`      | matched pairs                                          | `Inner`            | `Inner`            |
//! | `Left`       | pairs + unmatched left rows (right columns null)       | `ProbeOuter`       | `BuildOuter`       |
//! | `Right`      | pairs + unmatched right rows                           | `BuildOuter`       | `ProbeOuter`       |
//! | `Full`       | pairs + unmatched rows of both sides                   | `Full`             | `Full`             |
//! | `LeftSemi`   | left rows with a match, once each                      | `ProbeSemi`        | `BuildSemi`        |
//! | `LeftAnti`   | left rows without a match                              | `ProbeAnti`        | `BuildAnti`        |
//! | `RightSemi`  | right rows with a match                                | `BuildSemi`        | `ProbeSemi`        |
//! | `RightAnti`  | right rows without a match                             | `BuildAnti`        | `ProbeAnti`        |
//! | `LeftMark`   | every left row plus `mark`: has it a match?            | `ProbeMark`        | `BuildMark`        |
//! | `LeftNotIn`  | left rows whose key is `NOT IN` the right keys (SQL)   | `ProbeNotIn`       | `BuildNotIn`       |
//! | `RightNotIn` | right rows whose key is `NOT IN` the left keys (SQL)   | `BuildNotIn`       | `ProbeNotIn`       |

use std::fmt;
use std::str::FromStr;

use crate::error::Side;

/// A join as the user defines it, over a left and a right input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JoinType {
    /// Matched pairs.
    Inner,
    /// Matched pairs and the left rows without a match.
    Left,
    /// Matched pairs and the right rows without a match.
    Right,
    /// Matched pairs and the rows of either side without a match.
    Full,
    /// Left rows with at least one match, each once (SQL `EXISTS`).
    LeftSemi,
    /// Left rows without a match (SQL `NOT EXISTS`).
    LeftAnti,
    /// Right rows with at least one match, each once.
    RightSemi,
    /// Right rows without a match.
    RightAnti,
    /// Every left row once, plus a non-null boolean column `mark` that says whether it
    /// has a match (the `EXISTS` mark of a decorrelated subquery).
    LeftMark,
    /// SQL `left.key NOT IN (SELECT right.key FROM right)`: null-aware, single key.
    /// If the right side is empty every left row is kept; otherwise a left row is kept
    /// only if its key is not null, no right key is null, and no right key equals it.
    LeftNotIn,
    /// SQL `right.key NOT IN (SELECT left.key FROM left)`, the mirror of
    /// [`LeftNotIn`](Self::LeftNotIn).
    RightNotIn,
}

impl JoinType {
    /// Every join type, for tests and help texts.
    pub const ALL: [JoinType; 11] = [
        JoinType::Inner,
        JoinType::Left,
        JoinType::Right,
        JoinType::Full,
        JoinType::LeftSemi,
        JoinType::LeftAnti,
        JoinType::RightSemi,
        JoinType::RightAnti,
        JoinType::LeftMark,
        JoinType::LeftNotIn,
        JoinType::RightNotIn,
    ];

    /// The engine's view of this join when `build` is the build side.
    pub fn resolve(self, build: Side) -> BuildJoinType {
        use BuildJoinType as B;
        let build_is_right = build == Side::Right;
        let pick = |if_right: B, if_left: B| if build_is_right { if_right } else { if_left };
        match self {
            JoinType::Inner => B::Inner,
            JoinType::Full => B::Full,
            JoinType::Left => pick(B::ProbeOuter, B::BuildOuter),
            JoinType::Right => pick(B::BuildOuter, B::ProbeOuter),
            JoinType::LeftSemi => pick(B::ProbeSemi, B::BuildSemi),
            JoinType::LeftAnti => pick(B::ProbeAnti, B::BuildAnti),
            JoinType::RightSemi => pick(B::BuildSemi, B::ProbeSemi),
            JoinType::RightAnti => pick(B::BuildAnti, B::ProbeAnti),
            JoinType::LeftMark => pick(B::ProbeMark, B::BuildMark),
            JoinType::LeftNotIn => pick(B::ProbeNotIn, B::BuildNotIn),
            JoinType::RightNotIn => pick(B::BuildNotIn, B::ProbeNotIn),
        }
    }

    /// Which inputs' columns the output carries, in order (the mark column of
    /// [`LeftMark`](Self::LeftMark) comes after them).
    pub fn output_sides(self) -> &'static [Side] {
        match self {
            JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full => {
                &[Side::Left, Side::Right]
            }
            JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark | JoinType::LeftNotIn => {
                &[Side::Left]
            }
            JoinType::RightSemi | JoinType::RightAnti | JoinType::RightNotIn => &[Side::Right],
        }
    }

    /// Whether this is a null-aware (`NOT IN`) join, which takes exactly one key.
    pub fn is_null_aware(self) -> bool {
        matches!(self, JoinType::LeftNotIn | JoinType::RightNotIn)
    }

    /// The name the command line uses.
    pub fn cli_name(self) -> &'static str {
        match self {
            JoinType::Inner => "inner",
            JoinType::Left => "left",
            JoinType::Right => "right",
            JoinType::Full => "full",
            JoinType::LeftSemi => "semi",
            JoinType::LeftAnti => "anti",
            JoinType::RightSemi => "right-semi",
            JoinType::RightAnti => "right-anti",
            JoinType::LeftMark => "mark",
            JoinType::LeftNotIn => "not-in",
            JoinType::RightNotIn => "right-not-in",
        }
    }
}

impl fmt::Display for JoinType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.cli_name())
    }
}

/// The error of parsing a [`JoinType`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown join type {0:?}; expected one of inner, left, right, full, semi, anti, right-semi, right-anti, mark, not-in, right-not-in")]
pub struct ParseJoinTypeError(String);

impl FromStr for JoinType {
    type Err = ParseJoinTypeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let normalized = s.to_ascii_lowercase().replace('_', "-");
        let found = JoinType::ALL
            .into_iter()
            .find(|t| t.cli_name() == normalized)
            .or(match normalized.as_str() {
                "left-semi" => Some(JoinType::LeftSemi),
                "left-anti" => Some(JoinType::LeftAnti),
                "left-mark" => Some(JoinType::LeftMark),
                "left-not-in" => Some(JoinType::LeftNotIn),
                "left-outer" => Some(JoinType::Left),
                "right-outer" => Some(JoinType::Right),
                "full-outer" | "outer" => Some(JoinType::Full),
                _ => None,
            });
        found.ok_or_else(|| ParseJoinTypeError(s.to_string()))
    }
}

/// A join in the engine's terms: what to do with build and probe rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuildJoinType {
    /// Matched pairs.
    Inner,
    /// Pairs, and probe rows without a match (build columns null).
    ProbeOuter,
    /// Pairs, and build rows without a match (probe columns null), at the end.
    BuildOuter,
    /// Pairs and the unmatched rows of both sides.
    Full,
    /// Probe rows with a match.
    ProbeSemi,
    /// Probe rows without a match.
    ProbeAnti,
    /// Build rows with a match, at the end.
    BuildSemi,
    /// Build rows without a match, at the end.
    BuildAnti,
    /// Every probe row and whether it has a match.
    ProbeMark,
    /// Every build row and whether it has a match, at the end.
    BuildMark,
    /// Probe rows `NOT IN` the build keys; needs only two facts of the build side.
    ProbeNotIn,
    /// Build rows `NOT IN` the probe keys; needs the visited bitmap and two facts of
    /// the probe side, so all the probe must be seen before any row is emitted.
    BuildNotIn,
}

impl BuildJoinType {
    /// Whether probe rows that can match no build row may be dropped before the join
    /// without changing its output: the join does not output them, and needs no fact
    /// about them (`NOT IN` with the subquery probing needs to know it saw a null or
    /// any row at all).
    pub fn may_skip_unmatchable_probe_rows(self) -> bool {
        matches!(
            self,
            Self::Inner
                | Self::BuildOuter
                | Self::ProbeSemi
                | Self::BuildSemi
                | Self::BuildAnti
                | Self::BuildMark
        )
    }

    /// Whether the output depends on the probe side only through the set of its keys
    /// (and, for `NOT IN`, whether it had any row and any null key): probe rows are
    /// neither output nor remembered, they only mark the build rows they match. Of
    /// probe rows with equal keys one then does what all of them would (without a
    /// residual filter, which reads the rest of the row).
    pub fn probe_keys_suffice(self) -> bool {
        matches!(
            self,
            Self::BuildSemi | Self::BuildAnti | Self::BuildMark | Self::BuildNotIn
        )
    }

    /// Whether matched (build, probe) pairs are output.
    pub fn emits_pairs(self) -> bool {
        matches!(
            self,
            Self::Inner | Self::ProbeOuter | Self::BuildOuter | Self::Full
        )
    }

    /// Whether build rows must remember that they were matched, for output at the end.
    pub fn tracks_visited_build_rows(self) -> bool {
        matches!(
            self,
            Self::BuildOuter
                | Self::Full
                | Self::BuildSemi
                | Self::BuildAnti
                | Self::BuildMark
                | Self::BuildNotIn
        )
    }

    /// Whether the probe loop needs, per probe row, whether it was matched.
    pub fn tracks_matched_probe_rows(self) -> bool {
        matches!(
            self,
            Self::ProbeOuter
                | Self::Full
                | Self::ProbeSemi
                | Self::ProbeAnti
                | Self::ProbeMark
                | Self::ProbeNotIn
        )
    }

    /// Whether a probe row can stop at its first passing match (existence joins).
    pub fn probe_stops_at_first_match(self) -> bool {
        matches!(
            self,
            Self::ProbeSemi | Self::ProbeAnti | Self::ProbeMark | Self::ProbeNotIn
        )
    }

    /// Whether a probe row that can never match (null key under SQL equality) is still
    /// output.
    pub fn emits_unmatched_probe_rows(self) -> bool {
        matches!(
            self,
            Self::ProbeOuter | Self::Full | Self::ProbeAnti | Self::ProbeMark
        )
    }

    /// Whether build rows are output after the probe side is exhausted.
    pub fn emits_build_rows_at_end(self) -> bool {
        self.tracks_visited_build_rows()
    }

    /// Whether this join needs build rows whose key can never match (null key under
    /// SQL equality) to be kept for the end.
    pub fn keeps_unmatchable_build_rows(self) -> bool {
        matches!(
            self,
            Self::BuildOuter | Self::Full | Self::BuildAnti | Self::BuildMark | Self::BuildNotIn
        )
    }

    /// Whether this is a null-aware (`NOT IN`) join.
    pub fn is_null_aware(self) -> bool {
        matches!(self, Self::ProbeNotIn | Self::BuildNotIn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in JoinType::ALL {
            assert_eq!(t.cli_name().parse::<JoinType>(), Ok(t));
        }
        assert!("sideways".parse::<JoinType>().is_err());
    }

    #[test]
    fn resolving_both_ways_is_symmetric() {
        let mirror = |t: JoinType| match t {
            JoinType::Left => JoinType::Right,
            JoinType::Right => JoinType::Left,
            JoinType::LeftSemi => JoinType::RightSemi,
            JoinType::RightSemi => JoinType::LeftSemi,
            JoinType::LeftAnti => JoinType::RightAnti,
            JoinType::RightAnti => JoinType::LeftAnti,
            JoinType::LeftNotIn => JoinType::RightNotIn,
            JoinType::RightNotIn => JoinType::LeftNotIn,
            other => other,
        };
        for t in JoinType::ALL {
            if t == JoinType::LeftMark {
                continue;
            }
            assert_eq!(t.resolve(Side::Right), mirror(t).resolve(Side::Left), "{t}");
        }
    }
}
