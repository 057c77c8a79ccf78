//! Shipping [`SpilljoinExec`] in a serialized plan: a `datafusion-proto`
//! `PhysicalExtensionCodec`, so that a distributed engine's scheduler (Ballista)
//! can send plans that contain the spilling join to its executors.
//!
//! ```text
//!  SpilljoinExec ──► "SPLJOIN1" │ pool share (u32) │ settings │ the HashJoinExec it
//!                                                              runs, over two empty
//!                                                              inputs, as DataFusion's
//!                                                              own protobuf
//! ```
//!
//! The join's definition travels as DataFusion encodes a `HashJoinExec` (keys,
//! filter, join type, projection, partition mode, null handling, `NOT IN`, fetch),
//! with `EmptyExec`s of the two input schemas in place of its inputs: the inputs are
//! encoded by the plan around it, and handed back when it is decoded. The settings
//! are the `spilljoin.*` values the plan was made with (the rule fixes them on each
//! join), so an executor runs the join as the planner's session configured it,
//! whether or not its own session knows the `spilljoin` namespace; memory and disk
//! are the executor's own (its `TaskContext`'s pool and `DiskManager`).
//!
//! [`SpilljoinCodec`] encodes nothing else: compose it with the engine's own codec
//! ([`SpilljoinCodec::composed_with`]).

use std::sync::Arc;

use datafusion::common::{not_impl_err, DataFusionError, Result};
use datafusion::config::ExtensionOptions;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{
    ComposedPhysicalExtensionCodec, PhysicalExtensionCodec, PhysicalPlanDecodeContext,
    PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf::PhysicalPlanNode;
use prost::Message;

use crate::config::SpilljoinConfig;
use crate::exec::SpilljoinExec;

/// What every encoded [`SpilljoinExec`] begins with: the node's name and the
/// encoding's version.
const MAGIC: &[u8; 8] = b"SPLJOIN1";

/// A `PhysicalExtensionCodec` for [`SpilljoinExec`] (see the module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct SpilljoinCodec;

impl SpilljoinCodec {
    /// This codec first, then `other` (a distributed engine's own codec, or
    /// DataFusion's default) for every other node: DataFusion's
    /// `ComposedPhysicalExtensionCodec`, which records which of the two encoded
    /// a node.
    pub fn composed_with(
        other: Arc<dyn PhysicalExtensionCodec>,
    ) -> Arc<dyn PhysicalExtensionCodec> {
        Arc::new(ComposedPhysicalExtensionCodec::new(vec![
            Arc::new(SpilljoinCodec),
            other,
        ]))
    }
}

impl PhysicalExtensionCodec for SpilljoinCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut reader = Reader::new(buf)?;
        let share = reader.u32()?;
        let settings = reader.settings()?;
        let node = PhysicalPlanNode::decode(reader.rest())
            .map_err(|e| corrupt(format!("the join's definition: {e}")))?;
        let decode = PhysicalPlanDecodeContext::new(ctx, self);
        let placeholder = proto_converter.proto_to_execution_plan(&node, &decode)?;
        let hash = placeholder.replace_children(inputs.to_vec(), recompute())?;
        let Some(hash) = hash.downcast_ref::<HashJoinExec>() else {
            return Err(corrupt("the definition is not a HashJoinExec"));
        };
        let exec =
            SpilljoinExec::try_new(Arc::new(hash.builder().build()?))?.with_settings(settings);
        exec.set_pool_share(usize::try_from(share).unwrap_or(usize::MAX));
        Ok(Arc::new(exec))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let Some(exec) = node.downcast_ref::<SpilljoinExec>() else {
            return not_impl_err!("SpilljoinCodec encodes SpilljoinExec, not {}", node.name());
        };
        let hash = exec.hash_join();
        let empty = |input: &Arc<dyn ExecutionPlan>| -> Arc<dyn ExecutionPlan> {
            Arc::new(EmptyExec::new(input.schema()))
        };
        let inputs = vec![empty(hash.left()), empty(hash.right())];
        let placeholder = Arc::clone(hash).replace_children(inputs, recompute())?;
        let definition = proto_converter.execution_plan_to_proto(&placeholder, self)?;
        buf.extend_from_slice(MAGIC);
        put_u32(buf, exec.pool_share())?;
        put_settings(buf, &exec.settings_or_default())?;
        definition
            .encode(buf)
            .map_err(|e| DataFusionError::Internal(format!("SpilljoinCodec: {e}")))
    }
}

/// Children replaced, properties recomputed from them (as `HashJoinExec` does).
fn recompute() -> ReplaceChildrenOptions {
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute)
}

fn corrupt(why: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Internal(format!(
        "SpilljoinCodec: not an encoded SpilljoinExec: {why}"
    ))
}

fn put_u32(buf: &mut Vec<u8>, value: usize) -> Result<()> {
    let value = u32::try_from(value)
        .map_err(|_| DataFusionError::Internal(format!("SpilljoinCodec: {value} > u32")))?;
    buf.extend_from_slice(&value.to_le_bytes());
    Ok(())
}

fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) -> Result<()> {
    put_u32(buf, bytes.len())?;
    buf.extend_from_slice(bytes);
    Ok(())
}

/// The settings that have a value, as a count and (key, value) pairs.
fn put_settings(buf: &mut Vec<u8>, settings: &SpilljoinConfig) -> Result<()> {
    let entries: Vec<(String, String)> = settings
        .entries()
        .into_iter()
        .filter_map(|e| Some((e.key, e.value?)))
        .collect();
    put_u32(buf, entries.len())?;
    for (key, value) in &entries {
        put_bytes(buf, key.as_bytes())?;
        put_bytes(buf, value.as_bytes())?;
    }
    Ok(())
}

/// Reads what [`SpilljoinCodec::try_encode`] wrote, refusing anything else.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Result<Self> {
        match buf.strip_prefix(MAGIC.as_slice()) {
            Some(buf) => Ok(Self { buf }),
            None => Err(corrupt("no SPLJOIN1 header")),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(corrupt("cut short"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32> {
        let mut word = [0; 4];
        word.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(word))
    }

    fn string(&mut self) -> Result<String> {
        let len = usize::try_from(self.u32()?).map_err(corrupt)?;
        String::from_utf8(self.take(len)?.to_vec()).map_err(corrupt)
    }

    fn settings(&mut self) -> Result<SpilljoinConfig> {
        let mut settings = SpilljoinConfig::default();
        for _ in 0..self.u32()? {
            let key = self.string()?;
            let value = self.string()?;
            settings.set_entry(&key, &value)?;
        }
        Ok(settings)
    }

    fn rest(self) -> &'a [u8] {
        self.buf
    }
}
