//! Settings of the spilling join, as a DataFusion `ConfigExtension` under the
//! `spilljoin` prefix: `SET spilljoin.enabled = false` works from SQL, and
//! `SessionConfig::set_str("spilljoin.max_depth", "2")` from code.
//!
//! The rule reads them when it plans (`enabled`); the operator reads the rest from
//! its `TaskContext` when it executes, so a `SET` between planning and execution of
//! the same plan still applies to how it spills.

use std::any::Any;
use std::fmt::Display;

use datafusion::common::config::{
    ConfigEntry, ConfigExtension, ConfigField, ConfigNonZeroUsize, ExecutionOptions,
    ExtensionOptions, Visit,
};
use datafusion::common::{DataFusionError, Result};
use datafusion::prelude::SessionConfig;
use spilljoin::spill::SpillCompression;

/// Defines a settings struct the way DataFusion's `extensions_options!` does (a
/// field per setting, its doc as the description, `set` by name), except that its
/// entries carry their full keys, `spilljoin.enabled` and not `enabled`, as
/// `datafusion.*` entries and Ballista's `ballista.*` do. Whatever copies a session
/// by its entries needs that: Ballista sends a client's settings to its scheduler,
/// and its executors' tasks, as `ConfigOptions::entries()` and sets them back by
/// key, so unprefixed keys were dropped there; `SHOW spilljoin.enabled` finds the
/// setting by it too.
macro_rules! prefixed_settings {
    (
        $(#[doc = $doc:literal])*
        pub struct $name:ident {
            $(
                $(#[doc = $field_doc:literal])*
                pub $field:ident : $ty:ty, default = $default:expr
            )*
        }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone)]
        #[non_exhaustive]
        pub struct $name {
            $( $(#[doc = $field_doc])* pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        impl ConfigField for $name {
            fn visit<V: Visit>(&self, v: &mut V, key_prefix: &str, _: &'static str) {
                $(
                    let key = format!("{key_prefix}.{}", stringify!($field));
                    self.$field.visit(v, &key, concat!($($field_doc),*).trim());
                )*
            }

            fn set(&mut self, key: &str, value: &str) -> Result<()> {
                let (field, rest) = key.split_once('.').unwrap_or((key, ""));
                match field {
                    $( stringify!($field) => self.$field.set(rest, value), )*
                    _ => Err(DataFusionError::Configuration(format!(
                        "no setting {}.{key}",
                        <Self as ConfigExtension>::PREFIX
                    ))),
                }
            }
        }

        impl ExtensionOptions for $name {
            fn as_any(&self) -> &dyn Any {
                self
            }

            fn as_any_mut(&mut self) -> &mut dyn Any {
                self
            }

            fn cloned(&self) -> Box<dyn ExtensionOptions> {
                Box::new(self.clone())
            }

            fn set(&mut self, key: &str, value: &str) -> Result<()> {
                ConfigField::set(self, key, value)
            }

            fn entries(&self) -> Vec<ConfigEntry> {
                let mut entries = Entries(Vec::new());
                self.visit(&mut entries, <Self as ConfigExtension>::PREFIX, "");
                entries.0
            }
        }
    };
}

/// Collects the entries a `ConfigField::visit` lists.
struct Entries(Vec<ConfigEntry>);

impl Visit for Entries {
    fn some<V: Display>(&mut self, key: &str, value: V, description: &'static str) {
        self.0.push(ConfigEntry {
            key: key.to_owned(),
            value: Some(value.to_string()),
            description,
        });
    }

    fn none(&mut self, key: &str, description: &'static str) {
        self.0.push(ConfigEntry {
            key: key.to_owned(),
            value: None,
            description,
        });
    }
}

prefixed_settings! {
    /// The `spilljoin.*` settings.
    pub struct SpilljoinConfig {
        /// Whether `SpilljoinRule` replaces `HashJoinExec` by `SpilljoinExec`.
        pub enabled: bool, default = true
        /// How deep spilled pairs may be repartitioned before the chunked fallback
        /// joins what is left (0 to 8).
        pub max_depth: u32, default = spilljoin::MAX_DEPTH
        /// Compression of spill files: `none`, `lz4` or `zstd`.
        pub spill_compression: String, default = "lz4".to_owned()
        /// Write and read the joins' spill files with direct I/O (`O_DIRECT`, Linux),
        /// past the page cache (`SpillConfig::direct_io`). DataFusion's own spill
        /// files stay buffered. Each thread then holds up to 7 MiB of direct I/O
        /// buffers outside the pool (`spilljoin::spill::DIRECT_IO_BYTES_PER_THREAD`:
        /// runs read ahead, writes in flight behind it).
        pub spill_direct_io: bool, default = false
        /// Spill this fraction (0 to 1) of the build partitions whatever the memory
        /// (tests: the spilling code runs on small inputs). 0 turns it off.
        pub force_spill: f64, default = 0.0
        /// Apply `force_spill` also to the levels that join spilled pairs, down to
        /// this depth.
        pub force_spill_depth: u32, default = 0
        /// Replace a `CollectLeft` join whose output keeps its hash-partitioned
        /// probe's partitioning too: the build is prepared once and each output
        /// partition probes it alone. With `false` such joins stay `HashJoinExec`s,
        /// which cannot spill (TPC-H SF10 Q2 under 16 MiB fails in one, joining
        /// `supplier`).
        pub prepared_collect_left: bool, default = true
        /// Such a join whose build DataFusion's statistics put under this many bytes
        /// stays a `HashJoinExec` all the same: a build of a few rows (TPC-H's
        /// `nation` and `region`) never needs to spill, and preparing it costs more
        /// than it saves (TPC-H SF1 Q5, Q7 and Q9 under 16 MiB took longer with
        /// every such join replaced). 0 replaces them all.
        pub prepared_collect_left_min_bytes: usize, default = 1 << 20
        /// Plan a hash join DataFusion would partition by its keys as `CollectLeft`
        /// (before `EnsureRequirements`, [`crate::CollectLeftRule`]): one join
        /// execution on `target_partitions` threads, which partitions and spills by
        /// itself, instead of a `RepartitionExec` of both inputs by key (which spills
        /// them once more under a limit) and one execution per partition. Not with
        /// `distributed`, whose tasks need the partitions.
        pub collect_left: bool, default = true
        /// Worker threads of each join execution. 0: one per partition of a
        /// `Partitioned` join (DataFusion runs the partitions side by side), and
        /// `target_partitions` for a `CollectLeft` join, which runs once for all of
        /// them (or builds once for all of them, and probes one per partition, where
        /// its output keeps the probe's partitioning).
        pub threads: usize, default = 0
        /// The partitions of a plan may run in different processes (the tasks of a
        /// distributed engine such as Ballista), so no join may coordinate its output
        /// partitions in memory: a `CollectLeft` join that outputs probe rows only
        /// builds for each partition and probes it with that partition's rows, one
        /// that outputs build rows (left, full, left semi, anti or mark) has its
        /// probe side coalesced to one partition, since which build rows no probe
        /// row matched is known only after all of them, and a `NOT IN` joins each
        /// partition of its outer side with the whole subquery.
        pub distributed: bool, default = false
    }
}

impl ConfigExtension for SpilljoinConfig {
    const PREFIX: &'static str = "spilljoin";
}

impl SpilljoinConfig {
    /// The settings of `config`: its extension if it has one, else the defaults.
    pub fn from_session(config: &datafusion::common::config::ConfigOptions) -> Self {
        config
            .extensions
            .get::<SpilljoinConfig>()
            .cloned()
            .unwrap_or_default()
    }

    /// Sets the setting an entry of [`ConfigOptions::entries`] names: by its full key
    /// (`spilljoin.max_depth`), or by the key alone, as entries were written before
    /// they carried the prefix.
    ///
    /// [`ConfigOptions::entries`]: datafusion::common::config::ConfigOptions::entries
    ///
    /// # Errors
    /// A configuration error for a key that names no setting or a value that does
    /// not parse.
    pub fn set_entry(&mut self, key: &str, value: &str) -> Result<()> {
        let field = key
            .strip_prefix(Self::PREFIX)
            .and_then(|rest| rest.strip_prefix('.'))
            .unwrap_or(key);
        ConfigField::set(self, field, value)
    }

    /// The spill compression, parsed.
    ///
    /// # Errors
    /// A configuration error naming the setting when it is not `none`, `lz4` or `zstd`.
    pub fn compression(&self) -> Result<SpillCompression> {
        self.spill_compression.parse().map_err(|e| {
            DataFusionError::Configuration(format!("spilljoin.spill_compression: {e}"))
        })
    }

    /// Checks the settings' ranges.
    ///
    /// # Errors
    /// A configuration error naming the first setting out of range.
    pub fn validate(&self) -> Result<()> {
        self.compression()?;
        if self.max_depth > spilljoin::MAX_DEPTH {
            return Err(DataFusionError::Configuration(format!(
                "spilljoin.max_depth is {}, at most {} is allowed",
                self.max_depth,
                spilljoin::MAX_DEPTH
            )));
        }
        if !(0.0..=1.0).contains(&self.force_spill) {
            return Err(DataFusionError::Configuration(format!(
                "spilljoin.force_spill is {}, expected 0 to 1",
                self.force_spill
            )));
        }
        Ok(())
    }
}

/// Adds the `spilljoin` settings (with their defaults) to `config` unless it has them,
/// and sets `datafusion.execution.max_spill_file_size_bytes` to 1 byte if it is at
/// DataFusion's default, so that `RepartitionExec` closes a spill file after each
/// batch. DataFusion 55.2's `RepartitionExec` can stop a query for good under a
/// memory limit when two of its input tasks spill to one output partition at once
/// (apache/datafusion#24883, fixed after 55.2 by #24891): its reader waits on the
/// older of two open files for a batch that is in the newer one, while the writers
/// wait for the reader. A file closed after each batch is never open and empty ahead
/// of a newer one. (A join that holds most of the pool makes the repartitions around
/// it spill: TPC-H SF10 Q18 through `spilljoin sql` under 64 MiB stopped so in half
/// its runs; BENCHMARKS.md, SQL section.) The cost is a file per spilled batch of a
/// repartition.
pub fn with_spilljoin_config(mut config: SessionConfig) -> SessionConfig {
    if config
        .options()
        .extensions
        .get::<SpilljoinConfig>()
        .is_none()
    {
        config = config.with_option_extension(SpilljoinConfig::default());
    }
    let execution = &mut config.options_mut().execution;
    if usize::from(execution.max_spill_file_size_bytes)
        == usize::from(ExecutionOptions::default().max_spill_file_size_bytes)
    {
        if let Ok(bytes) = ConfigNonZeroUsize::try_new(REPARTITION_SPILL_FILE_BYTES) {
            execution.max_spill_file_size_bytes = bytes;
        }
    }
    config
}

/// The size at which `RepartitionExec` closes a spill file and starts another
/// ([`with_spilljoin_config`]): after every batch.
pub(crate) const REPARTITION_SPILL_FILE_BYTES: usize = 1;

#[cfg(test)]
mod tests {
    use super::*;

    /// Repartition spill files are closed after each batch unless the session chose
    /// a size of its own, which is kept.
    #[test]
    fn repartition_spill_files_hold_one_batch_unless_chosen() -> Result<()> {
        let ours = with_spilljoin_config(SessionConfig::new());
        let bytes = usize::from(ours.options().execution.max_spill_file_size_bytes);
        assert_eq!(bytes, REPARTITION_SPILL_FILE_BYTES);
        let mut chosen = SessionConfig::new();
        chosen
            .options_mut()
            .set("datafusion.execution.max_spill_file_size_bytes", "4096")?;
        let kept = with_spilljoin_config(chosen);
        let bytes = usize::from(kept.options().execution.max_spill_file_size_bytes);
        assert_eq!(bytes, 4096);
        Ok(())
    }

    #[test]
    fn settings_parse_by_name() {
        let mut config = with_spilljoin_config(SessionConfig::new());
        config
            .options_mut()
            .set("spilljoin.enabled", "false")
            .unwrap();
        config
            .options_mut()
            .set("spilljoin.max_depth", "2")
            .unwrap();
        config
            .options_mut()
            .set("spilljoin.spill_compression", "zstd")
            .unwrap();
        let settings = SpilljoinConfig::from_session(config.options());
        assert!(!settings.enabled);
        assert_eq!(settings.max_depth, 2);
        assert_eq!(settings.compression().unwrap(), SpillCompression::Zstd);
        assert!(config
            .options_mut()
            .set("spilljoin.no_such_setting", "1")
            .is_err());
    }

    /// A session rebuilt from another's entries, key by key (as Ballista's scheduler
    /// and executors rebuild a client's), has its `spilljoin.*` settings.
    #[test]
    fn a_session_copied_by_its_entries_keeps_the_settings() -> Result<()> {
        let mut client = with_spilljoin_config(SessionConfig::new());
        client.options_mut().set("spilljoin.enabled", "false")?;
        client.options_mut().set("spilljoin.force_spill", "0.5")?;
        let entries = client.options().entries();
        let enabled = entries.iter().find(|e| e.key == "spilljoin.enabled");
        assert_eq!(enabled.and_then(|e| e.value.as_deref()), Some("false"));
        assert!(enabled.is_some_and(|e| e.description.starts_with("Whether")));

        let mut copy = with_spilljoin_config(SessionConfig::new());
        for entry in &entries {
            if let Some(value) = &entry.value {
                // Keys of other extensions than this session has fail; ours may not.
                if entry.key.starts_with("spilljoin.") {
                    copy.options_mut().set(&entry.key, value)?;
                }
            }
        }
        let settings = SpilljoinConfig::from_session(copy.options());
        assert!(!settings.enabled);
        assert_eq!(settings.force_spill, 0.5);
        Ok(())
    }

    /// An entry's key sets its setting with or without the prefix; another
    /// extension's key or an unknown one is refused.
    #[test]
    fn entries_set_by_full_or_bare_key() -> Result<()> {
        let mut settings = SpilljoinConfig::default();
        settings.set_entry("spilljoin.max_depth", "2")?;
        settings.set_entry("force_spill", "0.25")?;
        assert_eq!((settings.max_depth, settings.force_spill), (2, 0.25));
        assert!(settings.set_entry("spilljoin.nothing", "1").is_err());
        assert!(settings.set_entry("ballista.max_depth", "1").is_err());
        Ok(())
    }

    #[test]
    fn out_of_range_settings_are_refused() {
        let bad = SpilljoinConfig {
            max_depth: 99,
            ..Default::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max_depth"));
        let bad = SpilljoinConfig {
            spill_compression: "gzip".into(),
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }
}
