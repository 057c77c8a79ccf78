//! Tests of [`ChainedTable`] in each of its modes: chains found whole, walks resumed
//! where they stopped, the choice of a mode, and the row-order test.

use super::*;
use std::ops::ControlFlow;

#[test]
fn finds_every_duplicate_and_skips_excluded_rows() {
    let hashes = [7u64, 9, 7, 3, 7, 7];
    let table = ChainedTable::build(&hashes, |row| row != 5);
    let mut found = vec![];
    table.for_each_candidate(7, &hashes, |row| {
        found.push(row);
        ControlFlow::Continue(())
    });
    found.sort();
    assert_eq!(found, [0, 2, 4]);
    let mut first = vec![];
    table.for_each_candidate(7, &hashes, |row| {
        first.push(row);
        ControlFlow::Break(())
    });
    assert_eq!(first.len(), 1);
    table.for_each_candidate(42, &hashes, |_| panic!("no such hash"));
    assert_eq!(table.size(), ChainedTable::size_for(hashes.len()));
}

/// The rows of a key-indexed table's chain for `word`, sorted.
fn chain_rows(table: &ChainedTable, word: u64) -> Vec<usize> {
    let mut found = vec![];
    table.for_each_candidate_from(table.first_direct(word), 0, &[], false, |row| {
        found.push(row);
        ControlFlow::Continue(())
    });
    found.sort();
    found
}

#[test]
fn a_key_indexed_table_finds_every_row_of_a_key_and_nothing_else() -> Result<(), &'static str> {
    let words = [107u64, 109, 107, 103, 107, 110];
    let (min, span) = ChainedTable::direct_span(&words).ok_or("not dense")?;
    assert_eq!((min, span), (103, 7));
    let table = ChainedTable::build_direct(&words, min, span);
    assert!(table.is_direct());
    assert_eq!(
        table.size(),
        ChainedTable::direct_size_for(span, words.len())
    );
    let rows_of = |word: u64| chain_rows(&table, word);
    assert_eq!(rows_of(107), [0, 2, 4]);
    assert_eq!(rows_of(109), [1]);
    assert_eq!(rows_of(110), [5]);
    for absent in [0, 102, 104, 108, 111, u64::MAX] {
        assert!(rows_of(absent).is_empty(), "{absent}");
    }
    // Stopping at the first row of a longer chain.
    let mut first = vec![];
    table.for_each_candidate_from(table.first_direct(107), 0, &[], false, |row| {
        first.push(row);
        ControlFlow::Break(())
    });
    assert_eq!(first.len(), 1);
    // One index shared by two partitions: each key's rows lie in one of them.
    let first_part = [5u64, 9, 5];
    let second_part = [7u64, 6, 7, 7];
    let (min, span) =
        ChainedTable::shared_direct_span(&[&first_part, &second_part]).ok_or("not dense")?;
    assert_eq!((min, span), (5, 4));
    let tables = ChainedTable::build_shared_direct(&[&first_part, &second_part], min, span, 2);
    let rows_in = chain_rows;
    assert_eq!(rows_in(&tables[0], 5), [0, 2]);
    assert_eq!(rows_in(&tables[0], 9), [1]);
    assert_eq!(rows_in(&tables[1], 7), [0, 2, 3]);
    assert_eq!(rows_in(&tables[1], 6), [1]);
    assert!(rows_in(&tables[1], 8).is_empty());
    // Spread-out keys are hashed instead.
    assert!(ChainedTable::direct_span(&[1, 1 << 40]).is_none());
    assert!(ChainedTable::direct_span(&[]).is_none());
    Ok(())
}

/// The rows of a table bucketed by key value whose key is `word`, sorted.
fn ranged_rows(table: &ChainedTable, words: &[u64], word: u64) -> Vec<usize> {
    let mut found = vec![];
    table.for_each_candidate_from(table.first_ranged(word), 0, &[], false, |row| {
        if words[row] == word {
            found.push(row);
        }
        ControlFlow::Continue(())
    });
    found.sort();
    // A walk that stops at every row and goes on from where it stopped finds the
    // same rows: what a walk resumed after its caller's buffer filled does.
    let mut resumed = vec![];
    let mut from = Some(table.first_ranged(word));
    while let Some(entry) = from {
        from = table.for_each_candidate_from(entry, 0, &[], false, |row| {
            if words[row] == word {
                resumed.push(row);
            }
            ControlFlow::Break(())
        });
    }
    resumed.sort();
    assert_eq!(found, resumed, "{word}");
    found
}

#[test]
fn a_table_bucketed_by_value_finds_every_row_of_a_key() -> Result<(), &'static str> {
    // Every fourth key of a wide range, some twice: too sparse for a key index.
    let mut words: Vec<u64> = (0..1000u64).map(|i| 1_000_000 + i * 4096).collect();
    words.extend([1_000_000, 1_000_000 + 4096 * 500]);
    assert!(ChainedTable::direct_span(&words).is_none());
    let table = ChainedTable::build_ranged(&words).ok_or("not spread evenly")?;
    assert!(table.is_ranged() && table.by_key() && !table.is_direct());
    assert!(table.size() <= ChainedTable::size_for(words.len()));
    assert_eq!(ranged_rows(&table, &words, 1_000_000), [0, 1000]);
    assert_eq!(
        ranged_rows(&table, &words, 1_000_000 + 4096 * 500),
        [500, 1001]
    );
    for i in [1u64, 999] {
        assert_eq!(
            ranged_rows(&table, &words, 1_000_000 + i * 4096),
            [i as usize]
        );
    }
    for absent in [0, 999_999, 1_000_001, 1_000_000 + 4096 * 1000, u64::MAX] {
        assert!(ranged_rows(&table, &words, absent).is_empty(), "{absent}");
    }
    // A bucket says whether its chain has more than its first row.
    assert_eq!(table.first_ranged(1_000_000 + 4096) & MORE, 0);
    assert_eq!(table.first_ranged(1_000_000) & MORE, MORE);
    // The whole u64 range, evenly spread: the top bits bucket it.
    let spread: Vec<u64> = (0..4096u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .chain([0, u64::MAX])
        .collect();
    let table = ChainedTable::build_ranged(&spread).ok_or("not spread evenly")?;
    for (row, &word) in spread.iter().enumerate() {
        assert!(ranged_rows(&table, &spread, word).contains(&row));
    }
    // Keys that bunch up are refused: a cluster next to one far-away key, or
    // one key repeated more than a chain may hold.
    let mut bunched: Vec<u64> = (0..1000u64).collect();
    bunched.push(1 << 40);
    assert!(ChainedTable::build_ranged(&bunched).is_none());
    let mut hot = vec![7u64; RANGED_MAX_CHAIN as usize + 1];
    hot.extend(0..10_000u64);
    assert!(ChainedTable::build_ranged(&hot).is_none());
    assert!(ChainedTable::build_ranged(&[]).is_none());
    // One key, or two: spans of 0 and 1.
    assert!(ChainedTable::build_ranged(&[5]).is_some());
    assert!(ChainedTable::build_ranged(&[5, 6]).is_some());
    // A chain may hold exactly RANGED_MAX_CHAIN rows (counted in a byte).
    let mut full = vec![7u64; RANGED_MAX_CHAIN as usize];
    full.extend(100..10_100u64);
    let table = ChainedTable::build_ranged(&full).ok_or("a full chain refused")?;
    assert_eq!(
        ranged_rows(&table, &full, 7),
        (0..RANGED_MAX_CHAIN as usize).collect::<Vec<_>>()
    );
    full.push(7);
    assert!(ChainedTable::build_ranged(&full).is_none());
    Ok(())
}

#[test]
fn lookups_in_key_order_walk_the_build_rows_in_order() -> Result<(), &'static str> {
    // Build rows in key order, every 64th key of a wide range on average.
    let words: Vec<u64> = (0..4096u64).map(|i| i * 64 + i % 7).collect();
    let table = ChainedTable::build_ranged(&words).ok_or("not spread evenly")?;
    let firsts = |probes: &mut dyn Iterator<Item = u64>| -> Vec<u32> {
        probes.map(|w| table.first_ranged(w)).collect()
    };
    // In key order, each key twice, with a miss (a key past the range) after
    // each: in order.
    let in_order = firsts(&mut words.iter().flat_map(|&w| [w, w, u64::MAX]));
    assert_eq!(in_order.iter().filter(|&&f| f == 0).count(), words.len());
    assert!(table.walks_in_row_order(&in_order));
    // Misses are not steps: a back step every 8 hits is out of order however
    // many misses lie between (here 64 after every 8 hits).
    let sparse_back: Vec<u64> = words
        .chunks(8)
        .flat_map(|c| [c[1], c[0]].into_iter().chain(c[2..].iter().copied()))
        .collect::<Vec<_>>()
        .chunks(8)
        .flat_map(|c| c.iter().copied().chain([u64::MAX; 64]))
        .collect();
    assert!(!table.walks_in_row_order(&firsts(&mut sparse_back.into_iter())));
    // Build rows written by two threads, groups of 64 keys each, one thread a
    // group ahead (groups 0, 2, 1, 4, 3, ...): probed in key order, a back step
    // every 128 rows.
    let groups: Vec<&[u64]> = words.chunks(64).collect();
    let mut order: Vec<usize> = vec![0];
    for g in (2..groups.len()).step_by(2) {
        order.extend([g, g - 1]);
    }
    order.push(groups.len() - 1);
    let two_threads: Vec<u64> = order.iter().flat_map(|&g| groups[g].to_vec()).collect();
    let table2 = ChainedTable::build_ranged(&two_threads).ok_or("not spread evenly")?;
    let in_key_order: Vec<u32> = words.iter().map(|&w| table2.first_ranged(w)).collect();
    assert!(table2.walks_in_row_order(&in_key_order));
    // Backwards, or every other key from the far end: not in order.
    let backwards = firsts(&mut words.iter().rev().copied());
    assert!(!table.walks_in_row_order(&backwards));
    let zigzag = firsts(
        &mut words
            .iter()
            .zip(words.iter().rev())
            .flat_map(|(&a, &b)| [a, b]),
    );
    assert!(!table.walks_in_row_order(&zigzag));
    // A hashed table's buckets follow no order.
    let hashed = ChainedTable::build(&words, |_| true);
    let hashed_firsts: Vec<u32> = words.iter().map(|&w| hashed.first(w)).collect();
    assert!(!hashed.walks_in_row_order(&hashed_firsts));
    Ok(())
}

#[test]
fn one_word_keys_get_a_key_index_or_value_buckets_or_none() -> Result<(), &'static str> {
    // Dense: indexed by key, no bigger than a hashed table.
    let dense: Vec<u64> = (100..1100u64).rev().collect();
    let table = ChainedTable::build_by_key(&dense).ok_or("dense refused")?;
    assert!(table.is_direct() && table.size() <= ChainedTable::size_for(dense.len()));
    for (row, &word) in dense.iter().enumerate() {
        assert_eq!(table.first_direct(word), row as u32 + 1);
    }
    assert_eq!(table.first_direct(99), 0);
    // Sparse but even: bucketed by value.
    let sparse: Vec<u64> = (0..1000u64).map(|i| i * 4096).collect();
    let table = ChainedTable::build_by_key(&sparse).ok_or("sparse refused")?;
    assert!(table.is_ranged() && !table.is_direct());
    assert_eq!(ranged_rows(&table, &sparse, 4096 * 3), [3]);
    // Bunched: neither (the caller hashes them).
    let mut bunched: Vec<u64> = (0..1000u64).collect();
    bunched.push(1 << 40);
    assert!(ChainedTable::build_by_key(&bunched).is_none());
    assert!(ChainedTable::build_by_key(&[]).is_none());
    Ok(())
}

/// Walks a chain from `first`, stopping after every `step` candidates and going on
/// from where the walk said: the rows seen, in order.
fn walk_in_steps(
    table: &ChainedTable,
    first: u32,
    hash: u64,
    hashes: &[u64],
    step: usize,
) -> Vec<usize> {
    let mut seen = vec![];
    let mut from = Some(first);
    while let Some(start) = from {
        let mut taken = 0;
        from = table.for_each_candidate_from(start, hash, hashes, true, |row| {
            seen.push(row);
            taken += 1;
            if taken == step {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
    }
    seen
}

#[test]
fn a_walk_stopped_anywhere_goes_on_where_it_stopped() -> Result<(), &'static str> {
    // A hot key (every third row) among others, in both kinds of table.
    let words: Vec<u64> = (0..300u64)
        .map(|i| if i % 3 == 0 { 301 } else { i })
        .collect();
    let hashes: Vec<u64> = words
        .iter()
        .map(|&w| w.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let hashed = ChainedTable::build(&hashes, |_| true);
    let (min, span) = ChainedTable::direct_span(&words).ok_or("not dense")?;
    let direct = ChainedTable::build_direct(&words, min, span);
    let hot = hashes[0];
    for (table, first) in [
        (&hashed, hashed.first(hot)),
        (&direct, direct.first_direct(301)),
    ] {
        let whole = walk_in_steps(table, first, hot, &hashes, usize::MAX);
        let mut sorted = whole.clone();
        sorted.sort();
        assert_eq!(sorted, (0..300).step_by(3).collect::<Vec<_>>());
        for step in [1, 2, 7, 99, 100, 101] {
            assert_eq!(
                walk_in_steps(table, first, hot, &hashes, step),
                whole,
                "step {step}"
            );
        }
    }
    // A chain of one row, and no chain.
    let one = direct.first_direct(1);
    assert_eq!(walk_in_steps(&direct, one, 0, &[], 1), [1]);
    assert_eq!(
        walk_in_steps(&direct, direct.first_direct(3), 0, &[], 1),
        Vec::<usize>::new()
    );
    Ok(())
}

#[test]
fn a_table_reports_the_mode_it_was_built_in() -> Result<(), &'static str> {
    let words: Vec<u64> = (0..1000u64).map(|i| i * 4096).collect();
    let hashed = ChainedTable::build(&words, |_| true);
    let (min, span) = ChainedTable::direct_span(&[3, 5, 4]).ok_or("not dense")?;
    let direct = ChainedTable::build_direct(&[3, 5, 4], min, span);
    let ranged = ChainedTable::build_ranged(&words).ok_or("not spread evenly")?;
    for (table, mode) in [
        (&hashed, TableMode::Hashed),
        (&direct, TableMode::KeyIndexed),
        (&ranged, TableMode::Ranged),
    ] {
        assert_eq!(table.mode(), mode);
        assert_eq!(table.is_direct(), mode == TableMode::KeyIndexed);
        assert_eq!(table.is_ranged(), mode == TableMode::Ranged);
        assert_eq!(table.by_key(), mode != TableMode::Hashed);
    }
    Ok(())
}
