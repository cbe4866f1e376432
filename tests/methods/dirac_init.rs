//! The dirac_init plugin:
//! - its function is `torch.nn.init.dirac_(w[:w.size(1)])`, checked by PyTorch on the same
//!   weights for wide, narrow, square and even kernels;
//! - through the real binary on the zoo's airbench net every 3×3 conv starts from identity
//!   filters and nothing else changes (a run at a vanishing learning rate against one without
//!   the plugin);
//! - a run killed with SIGKILL and resumed writes the straight run's checkpoints bit for bit;
//! - two data-parallel ranks start from the same identity filters.

use crate::airbench;

use airbench::{airbench, model_tensor, read, resumable};
use tessera_plugin_api::tch::{Device, Kind, Tensor};
use tessera_tests::dist::{assert_all_succeeded, train_ranks};
use tessera_tests::*;

/// Applies `torch.nn.init.dirac_(w[:w.size(1)])` to every `before_i` of `argv[1]` and compares
/// with `after_i` exactly.
const REFERENCE: &str = r#"
import sys, torch
sys.path.insert(0, "scripts")
import pytorch_models
tensors, _ = pytorch_models.read_safetensors(sys.argv[1])
count = 0
for name in sorted(n for n in tensors if n.startswith("before_")):
    w = tensors[name].clone()
    torch.nn.init.dirac_(w[:w.size(1)])
    ours = tensors["after_" + name[len("before_"):]]
    if not torch.equal(w, ours):
        print(f"FAIL {name}: {tuple(w.shape)} max diff {(w - ours).abs().max()}")
        sys.exit(1)
    count += 1
print(f"matched={count}")
"#;

#[test]
fn the_function_is_torchs_dirac_on_the_first_in_channels_filters() {
    let dir = TempDir::new("dirac-reference");
    let mut tensors = Vec::new();
    for (i, shape) in [
        [16i64, 8, 3, 3],
        [4, 16, 3, 3],
        [8, 8, 3, 3],
        [6, 3, 2, 2],
        [5, 2, 5, 5],
    ]
    .iter()
    .enumerate()
    {
        let before = Tensor::randn(shape, (Kind::Float, Device::Cpu));
        let after = before.copy();
        dirac_init::dirac_rows(&after).expect("dirac");
        tensors.push((format!("before_{i}"), before));
        tensors.push((format!("after_{i}"), after));
    }
    let file = dir.join("cases.safetensors");
    let named: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    Tensor::write_safetensors(&named, &file).expect("write the cases");
    if !python_can_import("torch", "dirac init") {
        return;
    }
    let out =
        python(&["-c", REFERENCE, &file.display().to_string()]).unwrap_or_else(|e| panic!("{e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "torch.nn.init.dirac_ disagrees:\n{text}"
    );
    assert!(text.contains("matched=5"), "{text}");
}

/// The 3×3 conv weights of the small airbench.
const CONVS: [&str; 6] = [
    "layers.1.conv1.weight",
    "layers.1.conv2.weight",
    "layers.2.conv1.weight",
    "layers.2.conv2.weight",
    "layers.3.conv1.weight",
    "layers.3.conv2.weight",
];

/// A run whose steps cannot move a weight of magnitude >= 1e-20 (learning rate 1e-30, no
/// momentum): its checkpoint holds the initial model.
fn frozen_in_time(run: &str, with_plugin: bool) -> TrainerToml {
    let mut toml = if with_plugin {
        airbench(run, "dirac_init", "")
    } else {
        let mut t = airbench(run, "dirac_init", "");
        t.algorithms.clear();
        t
    };
    toml.optimizer = "name = \"sgd\"\nlr = 1e-30".to_owned();
    toml.max_duration = "1ba".to_owned();
    toml
}

#[test]
fn every_3x3_conv_of_airbench_starts_from_identity_filters() {
    let dir = TempDir::new("dirac-train");
    let text = |run: &str, with: bool| {
        format!(
            "{}\n[checkpoint]\ninterval = \"1ba\"\n",
            frozen_in_time(run, with).render()
        )
    };
    dir.write("trainer.toml", &text("with", true));
    let out = train(&dir, &[], &[]);
    out.assert_success();
    assert!(
        out.stderr.contains("identity-initialised 6 convolution(s)"),
        "{}",
        out.dump()
    );
    dir.write("trainer.toml", &text("without", false));
    train(&dir, &[], &[]).assert_success();
    let (with, without) = (
        read(&dir, "with", "ep0-ba1.ckpt"),
        read(&dir, "without", "ep0-ba1.ckpt"),
    );
    let close = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]) < 1e-20;
    for name in CONVS {
        let (w, plain) = (model_tensor(&with, name), model_tensor(&without, name));
        let s = w.size();
        let rows = s[0].min(s[1]);
        let identity = Tensor::zeros([rows, s[1], 3, 3], (Kind::Float, Device::Cpu));
        for d in 0..rows {
            let _ = identity.get(d).get(d).get(1).get(1).fill_(1.0);
        }
        assert!(
            close(&w.narrow(0, 0, rows), &identity),
            "{name}: identity filters"
        );
        assert!(
            s[0] == rows
                || close(
                    &w.narrow(0, rows, s[0] - rows),
                    &plain.narrow(0, rows, s[0] - rows)
                ),
            "{name}: the other filters keep their init"
        );
    }
    for other in [
        "whiten.weight",
        "whiten.bias",
        "head.weight",
        "layers.2.norm1.weight",
    ] {
        assert!(
            close(&model_tensor(&with, other), &model_tensor(&without, other)),
            "{other} changed"
        );
    }
}

#[test]
fn killed_and_resumed_is_exact() {
    airbench::assert_killed_and_resumed_exactly("dirac-resume", |run| {
        resumable(run, "dirac_init", "", "")
    });
}

#[test]
fn two_ranks_start_from_the_same_identity_filters() {
    let dir = TempDir::new("dirac-dp");
    let toml = frozen_in_time("dp", true);
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"1ba\"\n", toml.render()),
    );
    let outputs = train_ranks(&dir, 2, &[]);
    assert_all_succeeded(&outputs);
    // Rank 0 reports (the other ranks log nothing).
    assert!(
        outputs[0]
            .stderr
            .contains("identity-initialised 6 convolution(s)"),
        "{}",
        outputs[0].dump()
    );
    let c = read(&dir, "dp", "ep0-ba1.ckpt");
    let w = model_tensor(&c, "layers.2.conv2.weight");
    for d in 0..16 {
        assert!(
            (w.double_value(&[d, d, 1, 1]) - 1.0).abs() < 1e-20,
            "filter {d}"
        );
    }
    assert!((w.abs().sum(Kind::Double).double_value(&[]) - 16.0).abs() < 1e-15);
}
