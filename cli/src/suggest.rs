//! "Did you mean ...?": the closest column name to one that does not exist.

use arrow_schema::Schema;
use spilljoin::Side;

use super::failure::Kind;

/// The candidate closest to `name`, if one is close enough to be a likely typo
/// (case-insensitive Jaro-Winkler similarity of at least 0.8, or a name that
/// differs only in case).
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let lower = name.to_lowercase();
    candidates
        .into_iter()
        .map(|c| (c, strsim::jaro_winkler(&lower, &c.to_lowercase())))
        .filter(|(_, score)| *score >= 0.8)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| c)
}

/// ` (did you mean "x"?)`, or nothing.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    closest(name, candidates)
        .map(|c| format!("; did you mean {c:?}?"))
        .unwrap_or_default()
}

/// The error for a column `name` that `side`'s `schema` does not have: its columns
/// and the closest name.
pub fn no_such_column(side: Side, name: &str, schema: &Schema) -> anyhow::Error {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    Kind::Definition.error(format!(
        "no column {name:?} in the {side} input (it has: {}){}",
        names.join(", "),
        did_you_mean(name, names.iter().copied())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_names_are_suggested() {
        let names = ["o_orderkey", "o_custkey", "o_totalprice"];
        assert_eq!(closest("o_orderky", names), Some("o_orderkey"));
        assert_eq!(closest("O_CUSTKEY", names), Some("o_custkey"));
        assert_eq!(closest("zzz", names), None);
        assert_eq!(did_you_mean("zzz", names), "");
    }
}
