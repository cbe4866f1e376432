use tch::{Device, Kind, Tensor};

use super::*;
use crate::model::{Gpt2Config, InputShape, ModelConfig};

/// A fresh folder, removed when the returned value is dropped.
fn dir(tag: &str) -> crate::data::idx::tests::TempDir {
    crate::data::idx::tests::TempDir::new(&format!("init-{tag}"))
}

fn build(config: &ModelConfig, input: InputShape, seed: i64) -> Model {
    tch::manual_seed(seed);
    Model::build(config, input, config.num_classes as i64, Device::Cpu).unwrap()
}

fn rgb(side: i64) -> InputShape {
    InputShape {
        channels: 3,
        height: side,
        width: side,
    }
}

/// Writes `tensors` as a plain safetensors file.
fn save(path: &Path, tensors: &[(String, Tensor)]) {
    let blobs: Vec<(String, crate::checkpoint::Blob)> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), crate::checkpoint::blob_of(n, t).unwrap()))
        .collect();
    let bytes =
        safetensors::tensor::serialize(blobs.iter().map(|(n, b)| (n.as_str(), b)), &None).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn export(model: &Model, config: &ModelConfig, input: InputShape, to: &Path) {
    let json = serde_json::to_value(config).unwrap();
    crate::export::export_model(model, &json, input, &[], to).unwrap();
}

fn same_tensors(a: &Model, b: &Model) -> bool {
    a.params.entries().iter().all(|e| {
        b.params
            .get(&e.name)
            .is_some_and(|o| o.tensor.equal(&e.tensor))
    })
}

#[test]
fn export_import_export_gives_the_same_bytes() {
    let d = dir("roundtrip");
    for (config, input) in [
        (ModelConfig::new(ModelName::Resnet18, 10), rgb(32)),
        (ModelConfig::new(ModelName::Mlp, 10), rgb(8)),
        (ModelConfig::new(ModelName::Cnn, 10), rgb(16)),
    ] {
        let a = build(&config, input, 1);
        let first = d.join(format!("{}-1.safetensors", config.name));
        export(&a, &config, input, &first);
        let b = build(&config, input, 2);
        assert!(!same_tensors(&a, &b), "two seeds drew the same weights");
        let report = load_init_weights(&b, config.name, &first, &[], true).unwrap();
        assert_eq!(report.loaded, a.params.entries().len());
        assert!(report.missing.is_empty() && report.unexpected.is_empty());
        assert!(same_tensors(&a, &b));
        let second = d.join(format!("{}-2.safetensors", config.name));
        export(&b, &config, input, &second);
        assert_eq!(
            std::fs::read(&first).unwrap(),
            std::fs::read(&second).unwrap(),
            "{}: export -> import -> export changed the file",
            config.name
        );
    }
}

#[test]
fn a_head_with_another_class_count_starts_fresh_and_the_rest_loads() {
    let d = dir("head");
    let big = ModelConfig::new(ModelName::Resnet18, 1000);
    let a = build(&big, rgb(32), 1);
    let file = d.join("imagenet.safetensors");
    export(&a, &big, rgb(32), &file);
    let small = ModelConfig::new(ModelName::Resnet18, 10);
    let b = build(&small, rgb(32), 2);
    let fc_before = b.params.get("fc.weight").unwrap().tensor.copy();
    let report = load_init_weights(&b, ModelName::Resnet18, &file, &[], true).unwrap();
    assert_eq!(report.new_head, ["fc.weight", "fc.bias"]);
    assert_eq!(report.loaded, a.params.entries().len() - 2);
    assert!(b.params.get("fc.weight").unwrap().tensor.equal(&fc_before));
    for e in b
        .params
        .entries()
        .iter()
        .filter(|e| !e.name.starts_with("fc."))
    {
        assert!(
            e.tensor.equal(&a.params.get(&e.name).unwrap().tensor),
            "{}",
            e.name
        );
    }
    // The same class count loads the head too.
    let c = build(&big, rgb(32), 3);
    let report = load_init_weights(&c, ModelName::Resnet18, &file, &[], true).unwrap();
    assert!(report.new_head.is_empty());
    assert!(same_tensors(&a, &c));
}

#[test]
fn strict_loading_lists_every_difference_and_copies_nothing() {
    let d = dir("strict");
    let mut wide = ModelConfig::new(ModelName::Mlp, 10);
    wide.hidden = vec![32, 16];
    let a = build(&wide, rgb(8), 1);
    let mut named: Vec<(String, Tensor)> = a.params.named_tensors();
    // One tensor renamed (one missing, one unexpected), one of another shape.
    named[0].0 = "layers.0.weight_old".to_owned();
    named[1].1 = Tensor::zeros([17], (Kind::Float, Device::Cpu));
    let file = d.join("w.safetensors");
    save(&file, &named);
    let b = build(&wide, rgb(8), 2);
    let before: Vec<Tensor> = b.params.entries().iter().map(|e| e.tensor.copy()).collect();
    let e = load_init_weights(&b, ModelName::Mlp, &file, &[], true)
        .unwrap_err()
        .to_string();
    for part in [
        "w.safetensors",
        "not in the file: `layers.0.weight`",
        "not in the model: `layers.0.weight_old`",
        "layers.0.bias: [17] in the file, [32] in the model",
        "init_ignore",
    ] {
        assert!(e.contains(part), "{part:?} not in {e}");
    }
    for (e, t) in b.params.entries().iter().zip(&before) {
        assert!(e.tensor.equal(t), "{} changed on a failed load", e.name);
    }
    // Not strict: what fits loads, the rest is reported.
    let report = load_init_weights(&b, ModelName::Mlp, &file, &[], false).unwrap();
    assert_eq!(report.missing, ["layers.0.weight"]);
    assert_eq!(report.unexpected, ["layers.0.weight_old"]);
    assert_eq!(report.mismatched.len(), 1);
    assert_eq!(report.loaded, a.params.entries().len() - 2);
    // Ignored on both sides: strict loading passes.
    let ignore = ["layers.0.*".to_owned()];
    let c = build(&wide, rgb(8), 3);
    let report = load_init_weights(&c, ModelName::Mlp, &file, &ignore, true).unwrap();
    assert_eq!(report.ignored, ["layers.0.weight", "layers.0.bias"]);
    assert!(c
        .params
        .get("layers.2.weight")
        .unwrap()
        .tensor
        .equal(&a.params.get("layers.2.weight").unwrap().tensor));
    assert!(check_patterns(&["[".to_owned()]).is_err());
}

#[test]
fn tied_weights_load_under_either_name_and_must_agree() {
    let d = dir("tied");
    let mut config = ModelConfig::new(ModelName::Gpt2, 50);
    config.gpt2 = Some(Gpt2Config {
        n_layer: 1,
        n_head: 2,
        n_embd: 8,
        n_positions: 16,
        ..Gpt2Config::default()
    });
    let input = rgb(1);
    let a = build(&config, input, 1);
    let wte = a
        .params
        .get("transformer.wte.weight")
        .unwrap()
        .tensor
        .copy();
    let mut named = a.params.named_tensors();
    // As transformers saves a tied model: the token embedding only.
    let file = d.join("hf.safetensors");
    save(&file, &named);
    let b = build(&config, input, 2);
    load_init_weights(&b, ModelName::Gpt2, &file, &[], true).unwrap();
    assert!(same_tensors(&a, &b));
    // The head's name only.
    for (n, _) in &mut named {
        if n == "transformer.wte.weight" {
            *n = "lm_head.weight".to_owned();
        }
    }
    save(&file, &named);
    let c = build(&config, input, 3);
    load_init_weights(&c, ModelName::Gpt2, &file, &[], true).unwrap();
    assert!(c
        .params
        .get("transformer.wte.weight")
        .unwrap()
        .tensor
        .equal(&wte));
    // Both names, different values: refused.
    named.push(("transformer.wte.weight".to_owned(), wte.zeros_like()));
    save(&file, &named);
    let e = load_init_weights(&c, ModelName::Gpt2, &file, &[], true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("tied weights differ"), "{e}");
}

#[test]
fn half_precision_files_convert_and_pickles_are_refused_with_the_script() {
    let d = dir("kinds");
    let config = ModelConfig::new(ModelName::Mlp, 10);
    let a = build(&config, rgb(4), 1);
    let half: Vec<(String, Tensor)> = a
        .params
        .named_tensors()
        .into_iter()
        .map(|(n, t)| (n, t.to_kind(Kind::Half)))
        .collect();
    let file = d.join("half.safetensors");
    save(&file, &half);
    let b = build(&config, rgb(4), 2);
    let report = load_init_weights(&b, ModelName::Mlp, &file, &[], true).unwrap();
    assert_eq!(report.converted.len(), half.len());
    let w = &b.params.get("layers.0.weight").unwrap().tensor;
    assert_eq!(w.kind(), Kind::Float);
    assert!(w.equal(&half[0].1.to_kind(Kind::Float)));
    let pickle = d.join("model.pt");
    std::fs::write(&pickle, b"PK\x03\x04 not a safetensors file").unwrap();
    let e = load_init_weights(&b, ModelName::Mlp, &pickle, &[], true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("scripts/to_safetensors.py"), "{e}");
    let junk = d.join("junk.safetensors");
    std::fs::write(&junk, b"nothing").unwrap();
    let e = load_init_weights(&b, ModelName::Mlp, &junk, &[], true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("junk.safetensors") && e.contains("not a safetensors file"),
        "{e}"
    );
}

#[test]
fn a_pickle_is_named_as_such_whatever_its_name_and_a_safetensors_header_is_not() {
    let d = dir("pickle");
    for (start, what) in [
        (
            &b"PK\x03\x04\x14\x00\x00\x00\x08\x00"[..],
            "torch.save's zip archive",
        ),
        (
            &b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8"[..],
            "a Python pickle",
        ),
    ] {
        let path = d.join("weights.safetensors");
        std::fs::write(&path, [start, &[0u8; 64][..]].concat()).unwrap();
        let e = crate::model::weight_files::header(&path)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(what)
                && e.contains("scripts/to_safetensors.py")
                && !e.contains("HeaderTooLarge"),
            "{e}"
        );
    }
    // A real safetensors file whose header length (0x280) starts like a pickle's opcodes.
    let path = d.join("real.safetensors");
    let mut header =
        serde_json::json!({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
            .to_string();
    header.push_str(&" ".repeat(0x280 - header.len()));
    let mut bytes = (0x280u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(1f32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let names = crate::model::weight_files::header(&path).unwrap();
    assert_eq!(names.len(), 1);
    // Too short to be anything.
    std::fs::write(&path, b"abc").unwrap();
    let e = crate::model::weight_files::header(&path)
        .unwrap_err()
        .to_string();
    assert!(e.contains("shorter than the 8 bytes"), "{e}");
}
