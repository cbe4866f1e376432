//! The host side of the ABI: the function table plugins call, over the engine's [`Stage`]
//! (the set-up state at `init`, the run state afterwards).

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{ROption, RResult, RStr, RString, RVec};
use tessera_plugin_api::abi::{
    Attribute, EvalResults, HostApi, HostApi_Ref, HostCtx, HostHandle, Metric, ModuleBox,
    ModuleInfo, NamedTensor, ParamGroup, ParamInfo, SliceInfo, TensorHandle, WrapperBox,
};
use tessera_plugin_api::{StepInfo, TimeInfo};

use crate::engine::{CallError, Stage};
use crate::model::{Attr, Role};

/// A handle for one call into a plugin, over `stage`. Valid while `stage` is borrowed.
pub fn handle(stage: &mut Stage<'_>) -> HostHandle {
    HostHandle {
        api: api(),
        ctx: HostCtx(stage as *mut Stage<'_> as *mut c_void),
    }
}

fn api() -> HostApi_Ref {
    static API: OnceLock<HostApi_Ref> = OnceLock::new();
    *API.get_or_init(|| {
        HostApi {
            time,
            get_tensor,
            set_tensor,
            rng_u64,
            log_metric,
            log,
            batch_keys,
            set_batch,
            forward,
            loss,
            modules,
            replace_module,
            parameters,
            parameter,
            set_trainable,
            lr,
            scale_lr,
            request_extra_pass,
            pass_index,
            checkpoint_pending,
            eval_results,
            request_stop,
            wrap_module,
            precision,
            ranks,
            claim_parameters,
            step_info,
            param_groups,
            set_param_group,
            training_sample,
            forward_eval,
            all_gather,
            parameter_slice,
            gather_slices,
        }
        .leak_into_prefix()
    })
}

/// Runs `f` on the stage behind `ctx`. A host panic must not unwind into plugin code, so it is
/// caught here and the process aborts with a message (it would be a host bug).
fn with_state<T>(ctx: HostCtx, f: impl FnOnce(&mut Stage<'_>) -> T) -> T {
    // SAFETY: `ctx` was made by `handle` from a `&mut Stage` that outlives the plugin call, and
    // plugins are called from one thread at a time.
    let state = unsafe { &mut *(ctx.0 as *mut Stage<'_>) };
    match catch_unwind(AssertUnwindSafe(|| f(state))) {
        Ok(v) => v,
        Err(_) => {
            eprintln!("tessera: internal error in a host function called by a plugin; aborting");
            std::process::abort()
        }
    }
}

extern "C" fn time(ctx: HostCtx) -> TimeInfo {
    with_state(ctx, |s| s.clock().info())
}

extern "C" fn get_tensor(ctx: HostCtx, key: RStr<'_>) -> ROption<TensorHandle> {
    with_state(ctx, |s| {
        match s.run("get_tensor").map(|r| r.tensor(key.as_str())) {
            Ok(Some(t)) => ROption::RSome(TensorHandle::from_tensor(t)),
            _ => ROption::RNone,
        }
    })
}

extern "C" fn set_tensor(ctx: HostCtx, key: RStr<'_>, value: TensorHandle) -> RResult<(), RString> {
    let value = value.into_tensor();
    with_state(ctx, |s| {
        result(
            s.run("set_tensor")
                .and_then(|r| r.set_tensor(key.as_str(), value)),
        )
    })
}

extern "C" fn ranks(_ctx: HostCtx) -> tessera_plugin_api::RankInfo {
    let (rank, world, local) = crate::dist::process_ranks();
    let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    tessera_plugin_api::RankInfo {
        rank: n(rank),
        world_size: n(world),
        local_rank: n(local),
    }
}

extern "C" fn precision(ctx: HostCtx) -> RString {
    with_state(ctx, |s| RString::from(s.precision().as_str()))
}

extern "C" fn rng_u64(ctx: HostCtx) -> u64 {
    with_state(ctx, |s| s.next_u64())
}

extern "C" fn log_metric(ctx: HostCtx, name: RStr<'_>, value: f64) {
    with_state(ctx, |s| s.log_metric(name.as_str().to_owned(), value))
}

extern "C" fn log(_ctx: HostCtx, level: u32, message: RStr<'_>) {
    let message = message.as_str();
    match level {
        0 => tracing::error!(target: "plugin", "{message}"),
        1 => tracing::warn!(target: "plugin", "{message}"),
        2 => tracing::info!(target: "plugin", "{message}"),
        _ => tracing::debug!(target: "plugin", "{message}"),
    }
}

fn named(entries: RVec<NamedTensor>) -> Vec<(String, tch::Tensor)> {
    entries
        .into_iter()
        .map(|n| (n.name.into_string(), n.tensor.into_tensor()))
        .collect()
}

fn result<T>(r: Result<T, CallError>) -> RResult<T, RString> {
    match r {
        Ok(v) => RResult::ROk(v),
        Err(e) => RResult::RErr(RString::from(e.0)),
    }
}

extern "C" fn batch_keys(ctx: HostCtx) -> RVec<RString> {
    with_state(ctx, |s| match s.run("batch_keys") {
        Ok(r) => r.batch.keys().into_iter().map(RString::from).collect(),
        Err(_) => RVec::new(),
    })
}

extern "C" fn set_batch(ctx: HostCtx, entries: RVec<NamedTensor>) -> RResult<(), RString> {
    let entries = named(entries);
    with_state(ctx, |s| {
        result(s.run("set_batch").and_then(|r| r.set_batch(entries)))
    })
}

extern "C" fn forward(
    ctx: HostCtx,
    input: TensorHandle,
    grad: bool,
) -> RResult<TensorHandle, RString> {
    let input = input.into_tensor();
    // `[distributed] sharding = "full"`: the parameters outside the units are gathered first.
    if let Err(e) = crate::dist::full::gather_outside_units() {
        return RResult::RErr(format!("forward: {e}").into());
    }
    with_state(ctx, |s| {
        result(
            s.run("forward")
                .and_then(|r| r.extra_forward(&input, grad))
                .map(TensorHandle::from_tensor),
        )
    })
}

extern "C" fn loss(
    ctx: HostCtx,
    output: TensorHandle,
    target: TensorHandle,
    per_sample: bool,
) -> RResult<TensorHandle, RString> {
    let (output, target) = (output.into_tensor(), target.into_tensor());
    with_state(ctx, |s| {
        result(
            s.run("loss")
                .and_then(|r| {
                    r.loss(&output, &target, per_sample)
                        .map_err(|e| CallError(format!("loss failed: {e}")))
                })
                .map(TensorHandle::from_tensor),
        )
    })
}

extern "C" fn modules(ctx: HostCtx) -> RVec<ModuleInfo> {
    with_state(ctx, |s| {
        s.note_modules_listed();
        s.model()
            .root
            .walk()
            .into_iter()
            .map(|m| ModuleInfo {
                path: m.path.into(),
                kind: m.kind.into(),
                attrs: m
                    .attrs
                    .into_iter()
                    .map(|(key, value)| Attribute {
                        key: key.into(),
                        value: match value {
                            Attr::Int(v) => v as f64,
                            Attr::Float(v) => v,
                            Attr::Bool(v) => f64::from(u8::from(v)),
                        },
                    })
                    .collect(),
                params: m.tensors.into_iter().map(RString::from).collect(),
            })
            .collect()
    })
}

extern "C" fn replace_module(
    ctx: HostCtx,
    path: RStr<'_>,
    module: ModuleBox,
    tensors: RVec<NamedTensor>,
) -> RResult<(), RString> {
    let tensors = named(tensors);
    with_state(ctx, |s| {
        let what = format!("replace_module(`{path}`)");
        result(s.model_for_surgery(&what).and_then(|model| {
            let layer = Box::new(super::PluginLayer::new(module, tensors));
            model
                .replace_module(path.as_str(), layer)
                .map_err(|e| CallError(e.0))
        }))
    })
}

extern "C" fn parameters(ctx: HostCtx) -> RVec<ParamInfo> {
    with_state(ctx, |s| {
        s.model()
            .params
            .entries()
            .iter()
            .map(|e| ParamInfo {
                name: e.name.as_str().into(),
                shape: e.tensor.size().into_iter().collect(),
                buffer: e.role == Role::Buffer,
                trainable: e.role == Role::Parameter && e.tensor.requires_grad(),
            })
            .collect()
    })
}

extern "C" fn parameter(ctx: HostCtx, name: RStr<'_>) -> ROption<TensorHandle> {
    // `[distributed] sharding = "full"`: the parameters are made whole first.
    if let Err(e) = crate::dist::full::summon() {
        tracing::error!("gathering the parameters for a method: {e}");
        return ROption::RNone;
    }
    with_state(ctx, |s| match s.model().params.get(name.as_str()) {
        Some(e) => ROption::RSome(TensorHandle::from_tensor(e.tensor.shallow_clone())),
        None => ROption::RNone,
    })
}

extern "C" fn set_trainable(ctx: HostCtx, name: RStr<'_>, trainable: bool) -> RResult<(), RString> {
    with_state(ctx, |s| result(s.set_trainable(name.as_str(), trainable)))
}

extern "C" fn lr(ctx: HostCtx) -> f64 {
    with_state(ctx, |s| s.lr())
}

extern "C" fn scale_lr(ctx: HostCtx, factor: f64) {
    with_state(ctx, |s| s.scale_lr(factor))
}

extern "C" fn request_extra_pass(ctx: HostCtx) -> RResult<(), RString> {
    with_state(ctx, |s| {
        result(s.run("request_extra_pass").and_then(|r| {
            if !r.in_train_batch {
                return Err(CallError(format!(
                    "request_extra_pass: only possible during a train batch (up to `{}`)",
                    crate::engine::Event::AFTER_TRAIN_BATCH
                )));
            }
            r.extra_pass_requested = true;
            Ok(())
        }))
    })
}

extern "C" fn pass_index(ctx: HostCtx) -> u32 {
    with_state(ctx, |s| s.run("pass_index").map_or(0, |r| r.pass_index))
}

extern "C" fn checkpoint_pending(ctx: HostCtx) -> bool {
    with_state(ctx, |s| {
        s.run("checkpoint_pending")
            .is_ok_and(|r| r.checkpoint_pending)
    })
}

extern "C" fn eval_results(ctx: HostCtx) -> ROption<EvalResults> {
    with_state(ctx, |s| {
        let Ok(Some(e)) = s.run("eval_results").map(|r| r.last_eval.as_ref()) else {
            return ROption::RNone;
        };
        let metric = |name: &str, value: f64| Metric {
            name: name.into(),
            value,
        };
        ROption::RSome(EvalResults {
            epoch: e.epoch,
            batch: e.batch,
            samples: e.samples,
            metrics: {
                let mut m = vec![
                    metric("accuracy", e.accuracy),
                    metric("cross_entropy", e.cross_entropy),
                ];
                if let Some(ppl) = e.perplexity {
                    m.push(metric("perplexity", ppl));
                }
                m.extend(e.extra.iter().map(|(name, value)| metric(name, value)));
                RVec::from(m)
            },
        })
    })
}

extern "C" fn request_stop(ctx: HostCtx, reason: RStr<'_>) -> RResult<(), RString> {
    with_state(ctx, |s| {
        result(s.run("request_stop").map(|r| {
            r.request_stop(reason.as_str().to_owned());
        }))
    })
}

extern "C" fn wrap_module(
    ctx: HostCtx,
    path: RStr<'_>,
    wrapper: WrapperBox,
    inner_name: RStr<'_>,
    tensors: RVec<NamedTensor>,
) -> RResult<(), RString> {
    let tensors = named(tensors);
    with_state(ctx, |s| {
        let what = format!("wrap_module(`{path}`)");
        result(s.model_for_surgery(&what).and_then(|model| {
            let inner_name = inner_name.as_str();
            let inner = (!inner_name.is_empty()).then_some(inner_name);
            let own = tensors
                .iter()
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect::<Vec<_>>();
            model
                .wrap_module(path.as_str(), inner, &own, |layer| {
                    Box::new(super::wrap::WrappedLayer::new(
                        wrapper,
                        layer,
                        inner_name.to_owned(),
                        tensors,
                    ))
                })
                .map_err(|e| CallError(e.0))
        }))
    })
}

// ---- 1.6 ----

extern "C" fn claim_parameters(ctx: HostCtx, names: RVec<RString>) -> RResult<(), RString> {
    let names: Vec<String> = names.into_iter().map(RString::into_string).collect();
    with_state(ctx, |s| result(s.claim_parameters(names)))
}

extern "C" fn step_info(ctx: HostCtx) -> StepInfo {
    with_state(ctx, |s| s.step_info())
}

extern "C" fn param_groups(ctx: HostCtx) -> RResult<RVec<ParamGroup>, RString> {
    with_state(ctx, |s| {
        result(s.run("param_groups").map(|r| {
            r.optimizer
                .groups()
                .into_iter()
                .map(|g| ParamGroup {
                    name: g.name.into(),
                    lr_multiplier: g.lr_multiplier,
                    weight_decay: g.weight_decay,
                    params: g.members.into_iter().map(RString::from).collect(),
                })
                .collect()
        }))
    })
}

extern "C" fn set_param_group(
    ctx: HostCtx,
    name: RStr<'_>,
    lr_multiplier: f64,
    weight_decay: f64,
) -> RResult<(), RString> {
    with_state(ctx, |s| {
        result(s.run("set_param_group").and_then(|r| {
            r.optimizer
                .set_group(name.as_str(), lr_multiplier, weight_decay)
                .map_err(CallError)
        }))
    })
}

extern "C" fn training_sample(ctx: HostCtx, samples: u64) -> RResult<RVec<NamedTensor>, RString> {
    with_state(ctx, |s| {
        let n = usize::try_from(samples).unwrap_or(usize::MAX);
        result(s.training_sample(n).map(|entries| {
            entries
                .into_iter()
                .map(|(name, t)| NamedTensor {
                    name: name.into(),
                    tensor: TensorHandle::from_tensor(t),
                })
                .collect()
        }))
    })
}

extern "C" fn forward_eval(ctx: HostCtx, input: TensorHandle) -> RResult<TensorHandle, RString> {
    let input = input.into_tensor();
    if let Err(e) = crate::dist::full::gather_outside_units() {
        return RResult::RErr(format!("forward_eval: {e}").into());
    }
    with_state(ctx, |s| {
        result(
            s.run("forward_eval")
                .and_then(|r| r.eval_forward(&input))
                .map(TensorHandle::from_tensor),
        )
    })
}

extern "C" fn all_gather(ctx: HostCtx, input: TensorHandle) -> RResult<TensorHandle, RString> {
    let input = input.into_tensor();
    with_state(ctx, |_| match crate::dist::all_gather_stacked(&input) {
        Ok(t) => RResult::ROk(TensorHandle::from_tensor(t)),
        Err(e) => RResult::RErr(format!("all_gather: {e}").into()),
    })
}

extern "C" fn parameter_slice(
    ctx: HostCtx,
    name: RStr<'_>,
    write: bool,
) -> RResult<ROption<SliceInfo>, RString> {
    with_state(ctx, |s| {
        let whole = s
            .model()
            .params
            .get(name.as_str())
            .map(|e| e.tensor.shallow_clone());
        match crate::dist::slices::slice(name.as_str(), whole, write) {
            Ok(slice) => RResult::ROk(
                slice
                    .map(|sl| SliceInfo {
                        tensor: TensorHandle::from_tensor(sl.tensor),
                        sharded: sl.sharded,
                        start: sl.start,
                        size: sl.size.into_iter().collect(),
                        strides: sl.strides.into_iter().collect(),
                    })
                    .into(),
            ),
            Err(e) => RResult::RErr(format!("parameter_slice `{name}`: {e}").into()),
        }
    })
}

extern "C" fn gather_slices(
    ctx: HostCtx,
    names: RVec<RString>,
    slices: RVec<TensorHandle>,
) -> RResult<RVec<TensorHandle>, RString> {
    let slices: Vec<(String, tch::Tensor)> = names
        .into_iter()
        .map(RString::into_string)
        .zip(slices.into_iter().map(TensorHandle::into_tensor))
        .collect();
    with_state(ctx, |_| match crate::dist::slices::gather(slices) {
        Ok(whole) => RResult::ROk(whole.into_iter().map(TensorHandle::from_tensor).collect()),
        Err(e) => RResult::RErr(format!("gather_slices: {e}").into()),
    })
}
