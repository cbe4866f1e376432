//! Reference outputs ("golden files") for a plugin's tests: a case is `<case>.json` (what was
//! run, each tensor's role, shape and dtype, scalar results) next to `<case>.safetensors` (the
//! tensors), as written by `tests/golden/generate.py` from Composer's own code.
//!
//! The folder is `$TESSERA_GOLDEN_DIR`, else `tests/golden` of the repository that holds this
//! crate. Everything here panics with a message naming the file or tensor (it is test code).
//!
//! ```no_run
//! use tessera_plugin_api::testing::golden::{assert_close, Golden};
//!
//! let g = Golden::load("label_smoothing");
//! for name in g.names_with_role("output") {
//!     let want = g.tensor(&name);
//!     assert_close(&name, &want.copy(), want, 1e-6, 1e-6);
//! }
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;
use tch::{Kind, Tensor};

/// The folder of Composer's golden outputs: `$TESSERA_GOLDEN_DIR`, else the repository's
/// `tests/golden`. Panics with instructions when `<case>.json` is not there.
pub fn golden_dir(case: &str) -> PathBuf {
    let dir = match std::env::var_os("TESSERA_GOLDEN_DIR") {
        Some(dir) => PathBuf::from(dir),
        // This crate's folder is `<repository>/plugin-api`.
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden")),
    };
    for ext in ["json", "safetensors"] {
        let file = dir.join(format!("{case}.{ext}"));
        assert!(
            file.is_file(),
            "golden file {} is missing: these tests need Composer's golden outputs \
             ({case}.json and {case}.safetensors). Point TESSERA_GOLDEN_DIR at the folder that \
             holds them (default: the repository's tests/golden).",
            file.display()
        );
    }
    dir
}

/// One golden case: its JSON description and its tensors by name.
pub struct Golden {
    /// The case's description (`<case>.json`): parameters, tensor roles, results.
    pub json: Value,
    /// The case's tensors (`<case>.safetensors`) by name.
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
        assert_eq!(
            json["case"],
            case,
            "{} is not the `{case}` case",
            json_path.display()
        );
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
            let dtype = entry["dtype"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: no dtype"));
            assert_eq!(
                kind_name(t.kind()),
                dtype,
                "{name}: dtype differs from the JSON"
            );
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
