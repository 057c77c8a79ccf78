//! Writes small, valid spill files to seed the `spill_reader` fuzz target.
//!
//! ```text
//! cargo run -p spilljoin-spill --example fuzz_seeds -- fuzz/seeds/spill_reader
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder, StringDictionaryBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, BinaryViewArray, Decimal128Array, Int64Array, RecordBatch, StringArray,
    StringViewArray, StructArray, TimestampMicrosecondArray,
};
use arrow_schema::DataType;
use spilljoin_spill::{SpillCompression, SpillConfig, SpillManager};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: fuzz_seeds <output directory>")?,
    );
    std::fs::create_dir_all(&out)?;

    let plain = RecordBatch::try_from_iter([
        (
            "k",
            Arc::new(Int64Array::from(vec![Some(1), None, Some(-3), Some(4)])) as ArrayRef,
        ),
        (
            "v",
            Arc::new(StringArray::from(vec![
                Some("a"),
                Some("bb"),
                None,
                Some("dddd"),
            ])),
        ),
    ])?;

    let mut dict = StringDictionaryBuilder::<Int32Type>::new();
    dict.extend([Some("x"), None, Some("y"), Some("x")]);
    let mut list = ListBuilder::new(StringBuilder::new());
    list.values().append_value("p");
    list.append(true);
    list.append(false);
    list.values().append_null();
    list.append(true);
    list.append(true);
    let nested = StructArray::try_from(vec![
        (
            "id",
            Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as ArrayRef,
        ),
        ("s", Arc::new(StringArray::from(vec!["a", "b", "c", "d"]))),
    ])?;
    let rich = RecordBatch::try_from_iter([
        ("dict", Arc::new(dict.finish()) as ArrayRef),
        ("list", Arc::new(list.finish())),
        ("struct", Arc::new(nested)),
        (
            "view",
            Arc::new(StringViewArray::from(vec![
                Some("short"),
                None,
                Some("a string longer than twelve bytes"),
                Some(""),
            ])),
        ),
        (
            "bin_view",
            Arc::new(BinaryViewArray::from(vec![
                Some(&b"\x00\x01"[..]),
                None,
                Some(&b"0123456789abcdef"[..]),
                None,
            ])),
        ),
        (
            "dec",
            Arc::new(
                Decimal128Array::from(vec![Some(12345), None, Some(-1), Some(0)])
                    .with_precision_and_scale(20, 2)?,
            ),
        ),
        (
            "ts",
            Arc::new(
                TimestampMicrosecondArray::from(vec![Some(0), Some(1), None, Some(-1)])
                    .with_timezone("UTC"),
            ),
        ),
    ])?;
    assert!(matches!(
        rich.schema().field(0).data_type(),
        DataType::Dictionary(_, _)
    ));

    let cases: [(&str, &RecordBatch, Vec<RecordBatch>); 6] = [
        (
            "plain-two-batches",
            &plain,
            vec![plain.clone(), plain.slice(1, 2)],
        ),
        ("plain-empty-batch", &plain, vec![plain.slice(0, 0)]),
        ("plain-no-batches", &plain, vec![]),
        ("rich-one-batch", &rich, vec![rich.clone()]),
        (
            "rich-two-batches",
            &rich,
            vec![rich.slice(0, 2), rich.slice(2, 2)],
        ),
        ("rich-sliced", &rich, vec![rich.slice(1, 3)]),
    ];
    let mut total = 0;
    for compression in [
        SpillCompression::None,
        SpillCompression::Lz4,
        SpillCompression::Zstd,
    ] {
        let manager = SpillManager::new(SpillConfig::default().with_compression(compression))?;
        for (name, schema_of, batches) in &cases {
            let mut writer = manager.create_writer(schema_of.schema(), name)?;
            for b in batches {
                writer.write(b)?;
            }
            let file = writer.finish()?;
            let target = out.join(format!("{name}-{compression}.arrows"));
            std::fs::copy(file.path(), &target)?;
            total += file.bytes();
        }
    }
    println!(
        "wrote {} seeds, {total} bytes, to {}",
        cases.len() * 3,
        out.display()
    );
    Ok(())
}
