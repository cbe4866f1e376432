//! The Vision Transformer (`vit_tiny`, `vit_small`, `vit_base`): timm's names, shapes and
//! computation. timm's own model (built by `tests/support/vit_reference.py` with the installed
//! wheel, random weights, nothing downloaded) loads into Tessera's with no missing or unexpected
//! tensor and gives the same logits; a trained run's export loads strictly into timm's model
//! and gives Tessera's logits; the methods the docs list for ViTs train with it.
//!
//! Needs `import timm` (`scripts/ensure-timm.sh`, on `TESSERA_TORCH_PYTHONPATH`); without it the
//! comparisons print a notice and stop, unless `TESSERA_REQUIRE_PYTORCH=1` (CI).

use std::path::Path;

use serde_json::{json, Value};
use tessera::model::{
    load_init_weights, read_state_dict, InputShape, Model, ModelConfig, ModelName, VitConfig,
};
use tessera_plugin_api::tch::{self, Device, Kind, Tensor};
use tessera_tests::export::rebuilt_output;
use tessera_tests::*;

fn save(path: &Path, tensors: &[(&str, &Tensor)]) {
    Tensor::write_safetensors(tensors, path).unwrap_or_else(|e| panic!("{e}"));
}

fn tensor<'a>(tensors: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    &tensors
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no tensor `{name}`"))
        .1
}

fn reference(args: &[&str]) -> String {
    let out = python(&[&["tests/support/vit_reference.py"], args].concat())
        .unwrap_or_else(|e| panic!("{e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "vit_reference.py {}: {text}", args[0]);
    text
}

#[test]
fn timms_weights_give_timms_logits() {
    if !python_can_import("timm", "Tessera's ViT with timm's") {
        return;
    }
    let dir = TempDir::new("vit-timm");
    // timm's vit_tiny at its own sizes, and a small custom one (patches of 4 on 16x16 images,
    // one input channel).
    let cases = [
        (ModelName::VitTiny, "vit_tiny_patch16_224", None, 32, 3),
        (
            ModelName::VitSmall,
            "vit_small_patch16_224",
            Some(VitConfig {
                embed_dim: 48,
                depth: 2,
                num_heads: 3,
                patch_size: 4,
            }),
            16,
            1,
        ),
    ];
    for (name, timm_name, sizes, side, channels) in cases {
        let mut spec =
            json!({"model": timm_name, "img_size": side, "classes": 10, "channels": channels});
        let mut config = ModelConfig::new(name, 10);
        if let Some(s) = sizes {
            spec["embed_dim"] = json!(s.embed_dim);
            spec["depth"] = json!(s.depth);
            spec["num_heads"] = json!(s.num_heads);
            spec["patch_size"] = json!(s.patch_size);
            config.vit = Some(s);
        }
        let out = dir.join(timm_name);
        std::fs::create_dir_all(&out).unwrap();
        reference(&["make", &spec.to_string(), &out.display().to_string()]);
        let input = InputShape {
            channels,
            height: side,
            width: side,
        };
        let model = Model::build(&config, input, 10, Device::Cpu).unwrap();
        let report = load_init_weights(&model, name, &out.join("weights.safetensors"), &[], true)
            .unwrap_or_else(|e| panic!("{timm_name}: {e}"));
        assert_eq!(report.loaded, model.params.entries().len());
        let io = read_state_dict(&out.join("io.safetensors")).unwrap();
        let logits = tch::no_grad(|| model.forward(tensor(&io, "x"), false)).unwrap();
        let diff = (&logits - tensor(&io, "logits"))
            .abs()
            .max()
            .double_value(&[]);
        println!("{timm_name} ({side}x{side}): max abs logits difference with timm {diff:e}");
        assert!(diff < 1e-4, "{timm_name}: {diff}");
    }
}

/// A run ([`TrainerToml`]) of `batches` batches of 16 synthetic 3x32x32 images of 10 classes on
/// a small ViT (`vit_tiny` with 2 blocks of 64 features, 4 heads, patches of 8), AdamW.
fn vit_toml(run_name: &str, batches: u32) -> TrainerToml {
    TrainerToml {
        seed: 3,
        model: "name = \"vit_tiny\"\nembed_dim = 64\ndepth = 2\nnum_heads = 4\npatch_size = 8"
            .to_owned(),
        optimizer: "name = \"adamw\"\nlr = 0.001".to_owned(),
        max_duration: format!("{batches}ba"),
        data: synthetic_rgb_data(128),
        ..TrainerToml::new(run_name)
    }
}

#[test]
fn a_trained_vit_exports_into_timms_model() {
    let dir = TempDir::new("vit-export");
    // A ViT learns slowly from scratch (timm's does the same on this data: flat for about 30
    // steps): 64 steps, and the last eight's mean loss below the first eight's.
    vit_toml("vit", 64).write_to(&dir);
    tessera(&["train", "trainer.toml"], dir.path(), &[]).assert_success();
    let lines = read_jsonl(&run_dir(&dir, "vit").join("metrics.jsonl"));
    let losses: Vec<f64> = lines
        .iter()
        .filter_map(|l| l["data"]["loss"].as_f64())
        .collect();
    assert_eq!(losses.len(), 64, "{losses:?}");
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    let (first, last) = (mean(&losses[..8]), mean(&losses[56..]));
    println!("mean loss of the first 8 steps {first:.3}, of the last 8 {last:.3}");
    assert!(last < first, "the loss did not fall: {losses:?}");
    let folder = run_dir(&dir, "vit").join("checkpoints");
    let ckpt = tessera::checkpoint::list(&folder)[0].clone();
    tessera(
        &[
            "export",
            &ckpt.display().to_string(),
            "--to",
            "vit.safetensors",
        ],
        dir.path(),
        &[],
    )
    .assert_success();
    if !python_can_import("timm", "the ViT export with timm's model") {
        return;
    }
    tch::manual_seed(5);
    let x = Tensor::randn([3, 3, 32, 32], (Kind::Float, Device::Cpu));
    let logits = rebuilt_output(&ckpt, &x);
    let io = dir.join("io.safetensors");
    save(&io, &[("x", &x), ("logits", &logits)]);
    let spec = json!({"model": "vit_tiny_patch16_224", "img_size": 32, "classes": 10,
        "embed_dim": 64, "depth": 2, "num_heads": 4, "patch_size": 8});
    let text = reference(&[
        "check",
        &spec.to_string(),
        &dir.join("vit.safetensors").display().to_string(),
        &io.display().to_string(),
    ]);
    println!("{text}");
}

#[test]
fn the_methods_for_vits_train_with_one() {
    // docs/models.md lists these as applying to the ViTs.
    let methods: [(&str, &str); 14] = [
        ("cutout", "length = 0.25"),
        (
            "selective_backprop",
            "start = 0.0\nend = 1.0\ninterrupt = 0",
        ),
        ("lookahead", "k = 1"),
        ("swa", "swa_start = \"0.25dur\"\nswa_end = \"0.75dur\""),
        ("muon", ""),
        ("label_smoothing", "smoothing = 0.1"),
        ("mixup", "alpha = 0.2"),
        ("cutmix", "alpha = 1.0"),
        ("ema", "half_life = \"2ba\""),
        ("sam", "rho = 0.05"),
        (
            "gradient_clipping",
            "clipping_type = \"norm\"\nclipping_threshold = 1.0",
        ),
        ("low_precision_layernorm", ""),
        ("layer_freezing", ""),
        ("randaugment", ""),
    ];
    let dir = TempDir::new("vit-methods");
    for (plugin, settings) in methods {
        vit_toml(plugin, 2)
            .algorithm(plugin, settings)
            .write_to(&dir);
        let out = tessera(&["train", "trainer.toml"], dir.path(), &[]);
        assert!(out.status.success(), "{plugin} on a ViT:\n{}", out.dump());
        let record: Value = read_json(&run_dir(&dir, plugin).join("run.json"));
        assert_eq!(record["batches"], 2, "{plugin}");
        assert!(record["final_accuracy"].is_number(), "{plugin}: {record}");
    }
}

#[test]
fn vit_sizes_that_do_not_fit_are_errors_naming_the_key() {
    let dir = TempDir::new("vit-errors");
    let with = |from: &str, to: &str| vit_toml("e", 1).render().replace(from, to);
    dir.write("trainer.toml", &with("num_heads = 4", "num_heads = 5"));
    tessera(&["train", "trainer.toml"], dir.path(), &[]).assert_failure(&[
        "num_heads",
        "multiple",
        "trainer.toml:",
    ]);
    dir.write("trainer.toml", &with("patch_size = 8", "patch_size = 7"));
    tessera(&["train", "trainer.toml"], dir.path(), &[]).assert_failure(&["patch_size", "32x32"]);
    dir.write(
        "trainer.toml",
        &with("patch_size = 8", "patch_size = 8\nwidth = 4"),
    );
    tessera(&["train", "trainer.toml"], dir.path(), &[]).assert_failure(&["width", "ViT"]);
    dir.write(
        "trainer.toml",
        &with("name = \"vit_tiny\"", "name = \"resnet18\"")
            .replace("embed_dim = 64\n", "")
            .replace("num_heads = 4\n", "")
            .replace("patch_size = 8\n", ""),
    );
    tessera(&["train", "trainer.toml"], dir.path(), &[])
        .assert_failure(&["depth", "ViTs", "resnet18"]);
}
