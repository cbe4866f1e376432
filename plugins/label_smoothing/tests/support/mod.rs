//! Test support shared by this crate's integration tests: the golden-file loader and a minimal
//! in-process host that drives a plugin's `Method` through its events.
//!
//! (The same file lives in `plugins/label_smoothing/tests/support` and
//! `plugins/cutout/tests/support`; each plugin crate stays self-contained.)
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::Value;
use tessera_plugin_api::abi::{HostApi, HostApi_Ref, HostCtx, HostHandle, TensorHandle};
use tessera_plugin_api::abi_stable::prefix_type::PrefixTypeTrait;
use tessera_plugin_api::abi_stable::std_types::{ROption, RResult, RStr, RString};
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_plugin_api::{Event, Settings, TimeInfo};

// ------------------------------------------------------------------------------------------
// Golden files
// ------------------------------------------------------------------------------------------

/// The folder of Composer's golden outputs: `$TESSERA_GOLDEN_DIR`, else the repository's
/// sibling `shared/golden`. Panics with instructions when `<case>.json` is not there.
pub fn golden_dir(case: &str) -> PathBuf {
    let dir = match std::env::var_os("TESSERA_GOLDEN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/golden")),
    };
    for ext in ["json", "safetensors"] {
        let file = dir.join(format!("{case}.{ext}"));
        assert!(
            file.is_file(),
            "golden file {} is missing: these tests need Composer's golden outputs \
             ({case}.json and {case}.safetensors). Point TESSERA_GOLDEN_DIR at the folder that \
             holds them (default: the repository's sibling shared/golden).",
            file.display()
        );
    }
    dir
}

/// One golden case: its JSON description and its tensors by name.
pub struct Golden {
    pub json: Value,
    pub tensors: BTreeMap<String, Tensor>,
}

impl Golden {
    /// Loads `<case>.json` and `<case>.safetensors`, checking that both list the same tensors
    /// with the same shapes and dtypes.
    pub fn load(case: &str) -> Golden {
        let dir = golden_dir(case);
        let json_path = dir.join(format!("{case}.json"));
        let text = std::fs::read_to_string(&json_path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", json_path.display()));
        let json: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("parsing {}: {e}", json_path.display()));
        assert_eq!(json["case"], case, "{} is not the `{case}` case", json_path.display());
        let st_path = dir.join(format!("{case}.safetensors"));
        let tensors: BTreeMap<String, Tensor> = Tensor::read_safetensors(&st_path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", st_path.display()))
            .into_iter()
            .collect();
        let golden = Golden { json, tensors };
        let described = golden.entries();
        assert_eq!(
            described.keys().collect::<Vec<_>>(),
            golden.tensors.keys().collect::<Vec<_>>(),
            "{case}.json and {case}.safetensors list different tensors"
        );
        for (name, entry) in described {
            let t = &golden.tensors[name];
            let shape: Vec<i64> = serde_json::from_value(entry["shape"].clone())
                .unwrap_or_else(|e| panic!("{name}: bad shape in JSON: {e}"));
            assert_eq!(t.size(), shape, "{name}: shape differs from the JSON");
            let dtype = entry["dtype"].as_str().unwrap_or_else(|| panic!("{name}: no dtype"));
            assert_eq!(kind_name(t.kind()), dtype, "{name}: dtype differs from the JSON");
        }
        golden
    }

    /// The JSON's `tensors` object.
    pub fn entries(&self) -> &serde_json::Map<String, Value> {
        self.json["tensors"]
            .as_object()
            .expect("the golden JSON has no `tensors` object")
    }

    /// The tensor `name` (panics naming it when absent).
    pub fn tensor(&self, name: &str) -> &Tensor {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("golden tensor `{name}` is missing"))
    }

    /// The role (`input`, `output`, ...) the JSON gives tensor `name`.
    pub fn role(&self, name: &str) -> &str {
        self.entries()[name]["role"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no role in the JSON"))
    }

    /// Names of the tensors with `role`, in name order.
    pub fn names_with_role(&self, role: &str) -> Vec<String> {
        self.entries()
            .keys()
            .filter(|name| self.role(name) == role)
            .cloned()
            .collect()
    }
}

/// The dtype names the golden JSON uses.
pub fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Float => "float32",
        Kind::Double => "float64",
        Kind::Int64 => "int64",
        Kind::Int => "int32",
        Kind::Uint8 => "uint8",
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Bool => "bool",
        _ => "other",
    }
}

/// Splits `key=value` pairs separated by `,` (as in `holes=2,length=0.25`).
pub fn parse_params(text: &str) -> BTreeMap<String, String> {
    text.split(',')
        .map(|pair| {
            let (k, v) = pair
                .split_once('=')
                .unwrap_or_else(|| panic!("`{pair}` in `{text}` is not key=value"));
            (k.trim().to_owned(), v.trim().to_owned())
        })
        .collect()
}

/// Asserts `got ≈ want` elementwise (`|g − w| ≤ atol + rtol·|w|`), same shape, naming `what`.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, rtol: f64, atol: f64) {
    assert_eq!(got.size(), want.size(), "{what}: shape");
    let got = got.to_kind(Kind::Double);
    let want = want.to_kind(Kind::Double);
    let err = (&got - &want).abs();
    let bound = want.abs() * rtol + atol;
    let worst = (&err - &bound).max().double_value(&[]);
    assert!(
        worst <= 0.0,
        "{what}: max |got − want| = {:e} exceeds {rtol:e}·|want| + {atol:e}",
        err.max().double_value(&[])
    );
}

/// The `DEFAULT_SETTINGS` TOML text (flat `key = value` lines) as settings JSON.
pub fn default_settings_json(toml: &str) -> String {
    let mut map = serde_json::Map::new();
    for line in toml.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("DEFAULT_SETTINGS line `{line}` is not `key = value`"));
        let value: Value = serde_json::from_str(v.trim())
            .unwrap_or_else(|e| panic!("DEFAULT_SETTINGS value `{v}`: {e}"));
        map.insert(k.trim().to_owned(), value);
    }
    Value::Object(map).to_string()
}

/// Settings from JSON text.
pub fn settings(json: &str) -> Settings {
    Settings::from_json(json).unwrap_or_else(|e| panic!("settings {json}: {e}"))
}

// ------------------------------------------------------------------------------------------
// A minimal host
// ------------------------------------------------------------------------------------------

/// Where the fake host's random numbers come from.
pub enum Rng {
    /// SplitMix64 from a seed.
    Seeded(u64),
    /// Exactly these values, in order; then zeros, counted in [`FakeHost::overdrawn`] (a panic
    /// must not unwind out of an `extern "C"` host function).
    Scripted(VecDeque<u64>),
}

/// One SplitMix64 step.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The host state a method sees through its `Context`: named tensors, an RNG, logged metrics.
pub struct FakeHost {
    pub tensors: HashMap<String, Tensor>,
    pub rng: Rng,
    pub metrics: Vec<(String, f64)>,
    /// Random numbers handed out.
    pub draws: usize,
    /// Random numbers asked for after a scripted stream ran out.
    pub overdrawn: usize,
}

impl FakeHost {
    pub fn new(rng: Rng) -> FakeHost {
        FakeHost {
            tensors: HashMap::new(),
            rng,
            metrics: Vec::new(),
            draws: 0,
            overdrawn: 0,
        }
    }

    pub fn with(mut self, key: &str, t: &Tensor) -> FakeHost {
        self.tensors.insert(key.to_owned(), t.copy());
        self
    }

    pub fn get(&self, key: &str) -> &Tensor {
        self.tensors
            .get(key)
            .unwrap_or_else(|| panic!("the host has no `{key}`"))
    }

    /// A handle over `self` for one plugin call; valid while `self` is borrowed.
    pub fn handle(&mut self) -> HostHandle {
        HostHandle {
            api: api(),
            ctx: HostCtx(self as *mut FakeHost as *mut c_void),
        }
    }

    /// Sends `event` to a boxed method (as the host does, through the ABI adapter).
    pub fn fire(
        &mut self,
        method: &mut tessera_plugin_api::abi::MethodBox,
        event: Event,
    ) -> Result<(), String> {
        let handle = self.handle();
        match method.on_event(event, handle) {
            RResult::ROk(()) => Ok(()),
            RResult::RErr(e) => Err(e.message.into_string()),
        }
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
        }
        .leak_into_prefix()
    })
}

fn host<'a>(ctx: HostCtx) -> &'a mut FakeHost {
    // SAFETY: `ctx` was made by `FakeHost::handle` from a `&mut FakeHost` borrowed for the call.
    unsafe { &mut *(ctx.0 as *mut FakeHost) }
}

extern "C" fn time(_ctx: HostCtx) -> TimeInfo {
    TimeInfo {
        training: true,
        ..TimeInfo::default()
    }
}

extern "C" fn get_tensor(ctx: HostCtx, key: RStr<'_>) -> ROption<TensorHandle> {
    match host(ctx).tensors.get(key.as_str()) {
        Some(t) => ROption::RSome(TensorHandle::from_tensor(t.shallow_clone())),
        None => ROption::RNone,
    }
}

extern "C" fn set_tensor(ctx: HostCtx, key: RStr<'_>, value: TensorHandle) -> RResult<(), RString> {
    // SAFETY: the plugin made the handle with `TensorHandle::from_tensor` and gave it up.
    let value = unsafe { value.into_tensor() };
    host(ctx).tensors.insert(key.as_str().to_owned(), value);
    RResult::ROk(())
}

extern "C" fn rng_u64(ctx: HostCtx) -> u64 {
    let h = host(ctx);
    h.draws += 1;
    match &mut h.rng {
        Rng::Seeded(state) => splitmix64(state),
        Rng::Scripted(values) => values.pop_front().unwrap_or_else(|| {
            h.overdrawn += 1;
            0
        }),
    }
}

extern "C" fn log_metric(ctx: HostCtx, name: RStr<'_>, value: f64) {
    host(ctx).metrics.push((name.as_str().to_owned(), value));
}

extern "C" fn log(_ctx: HostCtx, _level: u32, _message: RStr<'_>) {}
