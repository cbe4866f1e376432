//! Tests of the CUDA keys: `train.deterministic`, `train.matmul_precision` and
//! `[distributed] backend` and `sharding`.

use super::*;
use crate::device::MatmulPrecision;
use crate::dist::Backend;

use super::tests::{parse, MINIMAL};

fn parse_with(text: &str, overrides: &[&str]) -> Result<Config, ConfigError> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    from_str_with_overrides(text, Path::new("/base/dir"), "trainer.toml", &overrides)
}

/// The minimal file with `extra` appended: keys of `[train]`, or new tables (line 10 on).
fn with(extra: &str) -> String {
    format!("{MINIMAL}{extra}")
}

#[test]
fn defaults_are_speed_first_and_recorded() {
    let c = parse(MINIMAL).unwrap();
    assert!(!c.train.deterministic);
    assert_eq!(c.train.matmul_precision, MatmulPrecision::High);
    assert_eq!(c.distributed.backend, Backend::Auto);
    // The run record and checkpoints hold the config: the keys are in it.
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(json["train"]["deterministic"], serde_json::json!(false));
    assert_eq!(json["train"]["matmul_precision"], serde_json::json!("high"));
    assert_eq!(json["distributed"]["backend"], serde_json::json!("auto"));
}

#[test]
fn each_value_is_read() {
    for (text, want) in MatmulPrecision::CHOICES {
        let c = parse(&with(&format!(
            "deterministic = true\nmatmul_precision = {text:?}\n"
        )))
        .unwrap();
        assert!(c.train.deterministic);
        assert_eq!(c.train.matmul_precision, want);
        assert_eq!(want.as_str(), text);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["train"]["matmul_precision"], serde_json::json!(text));
    }
    for (text, want) in Backend::CHOICES {
        let c = parse(&with(&format!("\n[distributed]\nbackend = {text:?}\n"))).unwrap();
        assert_eq!(c.distributed.backend, want);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["distributed"]["backend"], serde_json::json!(text));
    }
    let c = parse_with(
        MINIMAL,
        &[
            "train.deterministic=true",
            "train.matmul_precision=\"medium\"",
            "distributed.backend=\"gloo\"",
        ],
    )
    .unwrap();
    assert!(c.train.deterministic);
    assert_eq!(c.train.matmul_precision, MatmulPrecision::Medium);
    assert_eq!(c.distributed.backend, Backend::Gloo);
}

#[test]
fn errors_name_the_key_and_line() {
    let e = parse(&with("matmul_precision = \"fast\"\n")).unwrap_err();
    assert_eq!(e.key, "train.matmul_precision");
    assert_eq!(e.kind, ErrorKind::InvalidValue);
    assert_eq!(e.location.line(), Some(10));
    assert!(
        e.message.contains("\"highest\"")
            && e.message.contains("\"high\"")
            && e.message.contains("\"medium\""),
        "{e}"
    );
    let e = parse(&with("matmul_precision = \"hihg\"\n")).unwrap_err();
    assert!(e.message.contains("did you mean \"high\""), "{e}");

    let e = parse(&with("deterministic = \"yes\"\n")).unwrap_err();
    assert_eq!(e.key, "train.deterministic");
    assert_eq!(e.kind, ErrorKind::WrongType);
    assert_eq!(e.location.line(), Some(10));

    let e = parse(&with("\n[distributed]\nbackend = \"mpi\"\n")).unwrap_err();
    assert_eq!(e.key, "distributed.backend");
    assert_eq!(e.kind, ErrorKind::InvalidValue);
    assert_eq!(e.location.line(), Some(12));
    assert!(
        e.message.contains("\"nccl\"") && e.message.contains("\"gloo\""),
        "{e}"
    );
    assert!(e.to_string().starts_with("trainer.toml:12:"), "{e}");
}

#[test]
fn cuda_graphs_is_read_and_recorded() {
    let c = parse(MINIMAL).unwrap();
    assert!(!c.train.cuda_graphs, "off by default");
    let c = parse(&with("cuda_graphs = true\n")).unwrap();
    assert!(c.train.cuda_graphs);
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(json["train"]["cuda_graphs"], serde_json::json!(true));
    let c = parse_with(MINIMAL, &["train.cuda_graphs=true"]).unwrap();
    assert!(c.train.cuda_graphs);
    let e = parse(&with("cuda_graphs = 1\n")).unwrap_err();
    assert_eq!(e.key, "train.cuda_graphs");
    assert_eq!(e.kind, ErrorKind::WrongType);
    assert_eq!(e.location.line(), Some(10));
}

#[test]
fn sharding_is_read_recorded_and_checked() {
    use crate::dist::shard::Sharding;
    assert_eq!(parse(MINIMAL).unwrap().distributed.sharding, Sharding::None);
    for (text, want) in Sharding::CHOICES {
        let c = parse(&with(&format!("\n[distributed]\nsharding = {text:?}\n"))).unwrap();
        assert_eq!(c.distributed.sharding, want);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["distributed"]["sharding"], serde_json::json!(text));
    }
    let c = parse_with(MINIMAL, &["distributed.sharding=\"gradients\""]).unwrap();
    assert_eq!(c.distributed.sharding, Sharding::Gradients);
    let e = parse(&with("\n[distributed]\nsharding = \"zero3\"\n")).unwrap_err();
    assert_eq!(e.key, "distributed.sharding");
    assert_eq!(e.location.line(), Some(12));
    assert!(e.message.contains("\"optimizer\""), "{e}");
    // The unit `full` gathers at a time.
    use crate::model::Unit;
    assert_eq!(parse(MINIMAL).unwrap().distributed.shard_unit, Unit::Block);
    let c = parse(&with("\n[distributed]\nshard_unit = \"stage\"\n")).unwrap();
    assert_eq!(c.distributed.shard_unit, Unit::Stage);
    let e = parse(&with("\n[distributed]\nshard_unit = \"layer\"\n")).unwrap_err();
    assert_eq!(e.key, "distributed.shard_unit");
    assert!(e.message.contains("\"block\""), "{e}");
    // The dtypes on the wire: float32 reduce and automatic gathers by default.
    use crate::dist::shard::Wire;
    let d = parse(MINIMAL).unwrap().distributed;
    assert_eq!((d.reduce_dtype, d.gather_dtype), (Wire::Fp32, Wire::Auto));
    let c = parse(&with(
        "\n[distributed]\nreduce_dtype = \"bf16\"\ngather_dtype = \"fp32\"\n",
    ))
    .unwrap();
    assert_eq!(c.distributed.reduce_dtype, Wire::Bf16);
    assert_eq!(c.distributed.gather_dtype, Wire::Fp32);
    // `auto` is no reduce dtype.
    let e = parse(&with("\n[distributed]\nreduce_dtype = \"auto\"\n")).unwrap_err();
    assert_eq!(e.key, "distributed.reduce_dtype");
    assert_eq!(e.location.line(), Some(12));
    let e = parse(&with("\n[distributed]\ngather_dtype = \"fp16\"\n")).unwrap_err();
    assert_eq!(e.key, "distributed.gather_dtype");
    assert!(e.message.contains("\"bf16\""), "{e}");
}
