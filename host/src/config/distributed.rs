//! `[distributed]`: data-parallel training (used when the run has several ranks; see
//! docs/distributed.md).

use serde::Serialize;

use super::error::ConfigError;
use super::reader::{Bounds, Tbl};
use super::section::section;
use crate::dist::shard::{Sharding, Wire};
use crate::dist::Backend;
use crate::model::Unit;

/// `[distributed]`
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DistributedConfig {
    /// Seconds every rank waits for the others to join (default 300).
    pub rendezvous_timeout: f64,
    /// Seconds a collective operation (an all-reduce) may wait for the other ranks before the
    /// run fails (default 1800, PyTorch's).
    pub timeout: f64,
    /// Size of the gradient buckets all-reduced while the backward pass goes on, in MiB
    /// (default 25, PyTorch DDP's).
    pub bucket_mb: f64,
    /// Look for parameters that get no gradient in a step (layers frozen or skipped by a method)
    /// so they do not block the all-reduce (default true; false saves a walk of the autograd
    /// graph per step when every parameter always gets a gradient).
    pub find_unused_parameters: bool,
    /// Batch-norm statistics over the global batch (all ranks) instead of each rank's share
    /// (default false: local, as PyTorch DDP).
    pub sync_batchnorm: bool,
    /// What carries the CUDA tensors' collectives: `auto` (default: NCCL on CUDA, Gloo on the
    /// CPU), `nccl` or `gloo`. CPU values always go through Gloo.
    pub backend: Backend,
    /// What each rank keeps of the training state: `none` (default: everything, DDP),
    /// `optimizer` (ZeRO-1: its slice of the optimizer state), `gradients` (ZeRO-2: and of
    /// the reduced gradients) or `full` (ZeRO-3: and of the parameters, each unit gathered
    /// while it runs); see docs/distributed.md.
    pub sharding: Sharding,
    /// Under `sharding = "full"`, the units gathered one at a time: `block` (default: a
    /// transformer or residual block) or `stage` (a container of blocks).
    pub shard_unit: Unit,
    /// Under `sharding = "gradients"` or `"full"`, the dtype the gradients are reduce-scattered
    /// in: `fp32` (default: exact, as DDP) or `bf16` (half the bytes; FSDP's `reduce_dtype`).
    pub reduce_dtype: Wire,
    /// Under `sharding = "full"`, the dtype the units' parameters are gathered in for the
    /// forward and backward passes: `auto` (default: `bf16` under `train.precision =
    /// "amp_bf16"`, else `fp32`), `fp32` or `bf16` (FSDP's `param_dtype`; the shards, the
    /// optimizer and checkpoints stay float32).
    pub gather_dtype: Wire,
    /// Under `sharding = "full"`, gather the next unit while one computes (forward: the next
    /// in order; backward: the previous), as FSDP's prefetching (default true).
    pub prefetch: bool,
}

section!(DistributedConfig {
    rendezvous_timeout: float(Bounds::POSITIVE),
    timeout: float(Bounds::POSITIVE),
    bucket_mb: float(Bounds::POSITIVE),
    find_unused_parameters: bool(),
    sync_batchnorm: bool(),
    backend: choice("backend", &Backend::CHOICES),
    sharding: choice("sharding", &Sharding::CHOICES),
    shard_unit: choice("shard_unit", &Unit::CHOICES),
    reduce_dtype: choice("reduce_dtype", &Wire::REDUCE),
    gather_dtype: choice("gather_dtype", &Wire::GATHER),
    prefetch: bool(),
});

impl Default for DistributedConfig {
    fn default() -> Self {
        DistributedConfig {
            rendezvous_timeout: 300.0,
            timeout: 1800.0,
            bucket_mb: 25.0,
            find_unused_parameters: true,
            sync_batchnorm: false,
            backend: Backend::Auto,
            sharding: Sharding::None,
            shard_unit: Unit::Block,
            reduce_dtype: Wire::Fp32,
            gather_dtype: Wire::Auto,
            prefetch: true,
        }
    }
}

pub(super) fn read(top: &Tbl<'_>) -> Result<DistributedConfig, ConfigError> {
    Ok(top
        .section("distributed", DistributedConfig::default)?
        .unwrap_or_default())
}
