//! The patch_whitening plugin through the real binary on the zoo's airbench net:
//! - its filters equal airbench's `init_whiten` computed by PyTorch on the same Fashion-MNIST
//!   images, read from the dataset's own files (an unshuffled run's first images are the sample),
//!   up to each eigenvector's sign;
//! - the weight never changes, the bias trains for `bias_epochs` epochs and then stops (and
//!   leaves the optimizer);
//! - a run killed with SIGKILL and resumed writes the straight run's checkpoints bit for bit;
//! - two data-parallel ranks train with rank 0's filters.

use crate::airbench;

use airbench::{airbench, model_tensor, read, resumable, short_epochs};
use tessera_plugin_api::tch::{Kind, Tensor};
use tessera_tests::dist::{assert_all_succeeded, train_ranks};
use tessera_tests::resume::{ckpt_dir, names};
use tessera_tests::*;

/// airbench94_muon.py's `CifarNet.init_whiten` on the first `n` training images of
/// Fashion-MNIST (IDX file `argv[1]`), normalised as the tests' config does, in float64; compares
/// its weight with the plugin's (`argv[3]`, a safetensors file with `weight`) filter by filter
/// up to sign. Prints `max_rel_diff=...`; exits 1 on a mismatch.
const REFERENCE: &str = r#"
import sys, struct, torch
sys.path.insert(0, "scripts")
import pytorch_models
path, n, weight_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(path, "rb") as f:
    magic, count, rows, cols = struct.unpack(">IIII", f.read(16))
    data = f.read(n * rows * cols)
images = torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(n, 1, rows, cols)
images = (images.double() / 255 - 0.2860) / 0.3530
# airbench's init_whiten, verbatim but for the dtype.
c, (h, w) = images.shape[1], (2, 2)
patches = images.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w)
patches_flat = patches.view(len(patches), -1)
est_patch_covariance = (patches_flat.T @ patches_flat) / len(patches_flat)
eigenvalues, eigenvectors = torch.linalg.eigh(est_patch_covariance, UPLO="U")
eigenvectors_scaled = eigenvectors.T.reshape(-1, c, h, w) / torch.sqrt(eigenvalues.view(-1, 1, 1, 1) + 5e-4)
reference = torch.cat((eigenvectors_scaled, -eigenvectors_scaled))
tensors, _ = pytorch_models.read_safetensors(weight_file)
ours = tensors["weight"].double()
assert ours.shape == reference.shape, (ours.shape, reference.shape)
worst = 0.0
for i in range(len(ours)):
    a, b = ours[i].flatten(), reference[i].flatten()
    diff = min((a - b).norm(), (a + b).norm()) / b.norm()
    worst = max(worst, float(diff))
print(f"max_rel_diff={worst:.3e}")
sys.exit(0 if worst < 1e-4 else 1)
"#;

#[test]
fn the_filters_are_airbenchs_init_whiten_on_the_same_images() {
    let dir = TempDir::new("pw-reference");
    let samples = 300;
    let mut toml = airbench("pw", "patch_whitening", &format!("samples = {samples}"));
    // Unshuffled: the sample is the training set's first images, in the file's order.
    toml.data = toml
        .data
        .replacen("batch_size = 64", "batch_size = 64\nshuffle = false", 1);
    dir.write(
        "trainer.toml",
        &format!("{}\n[checkpoint]\ninterval = \"3ba\"\n", toml.render()),
    );
    let out = train(&dir, &[], &[]);
    out.assert_success();
    assert!(
        out.stderr
            .contains("`whiten.weight` set from the 2x2 patches of 300 training images"),
        "{}",
        out.dump()
    );
    let ckpt = read(&dir, "pw", "ep0-ba3.ckpt");
    let weight = model_tensor(&ckpt, "whiten.weight");
    assert_eq!(weight.size(), [8, 1, 2, 2]);
    assert!(weight.narrow(0, 4, 4).equal(&-weight.narrow(0, 0, 4)));
    assert!(
        !ckpt
            .meta
            .optimizer
            .members
            .iter()
            .any(|m| m == "whiten.weight"),
        "the weight is frozen"
    );
    let file = dir.join("weight.safetensors");
    Tensor::write_safetensors(&[("weight", &weight)], &file).expect("write the weight");

    if !python_can_import("torch", "patch whitening") {
        return;
    }
    let images = data_root().join("fashion-mnist/train-images-idx3-ubyte");
    let out = python(&[
        "-c",
        REFERENCE,
        &images.display().to_string(),
        &samples.to_string(),
        &file.display().to_string(),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the PyTorch reference disagrees:\n{text}"
    );
    assert!(text.contains("max_rel_diff="), "{text}");
    eprintln!("patch whitening vs airbench's init_whiten: {}", text.trim());
}

#[test]
fn the_weight_stays_and_the_bias_trains_for_bias_epochs() {
    let dir = TempDir::new("pw-bias");
    let mut toml = airbench("pw", "patch_whitening", "samples = 64\nbias_epochs = 2");
    toml.max_duration = "4ep".to_owned();
    dir.write("trainer.toml", &short_epochs(&toml));
    train(&dir, &[], &[]).assert_success();
    let all = names(&ckpt_dir(&dir, "pw"));
    assert_eq!(all.len(), 4, "{all:?}");
    let c: Vec<_> = all.iter().map(|n| read(&dir, "pw", n)).collect();
    let tensor = |i: usize, name: &str| model_tensor(&c[i], name);
    for i in 1..4 {
        assert!(tensor(0, "whiten.weight").equal(&tensor(i, "whiten.weight")));
    }
    // Trained in the first two epochs (epoch 1 moves it from ep1 to ep2), frozen from the
    // third on.
    assert!(!tensor(0, "whiten.bias").equal(&tensor(1, "whiten.bias")));
    assert!(tensor(1, "whiten.bias").equal(&tensor(2, "whiten.bias")));
    assert!(tensor(2, "whiten.bias").equal(&tensor(3, "whiten.bias")));
    let member = |i: usize| {
        c[i].meta
            .optimizer
            .members
            .iter()
            .any(|m| m == "whiten.bias")
    };
    // A checkpoint at an epoch end comes before the next epoch's start, where it is frozen.
    assert_eq!(
        [member(0), member(1), member(2), member(3)],
        [true, true, false, false]
    );
    assert!(!tensor(2, "layers.1.conv1.weight").equal(&tensor(3, "layers.1.conv1.weight")));
}

#[test]
fn killed_and_resumed_is_exact() {
    // The bias freezes at the start of epoch 2, after the resume from epoch 1's checkpoint.
    airbench::assert_killed_and_resumed_exactly("pw-resume", |run| {
        resumable(run, "patch_whitening", "samples = 64\nbias_epochs = 2", "")
    });
}

#[test]
fn two_ranks_train_with_rank_0s_filters() {
    let dir = TempDir::new("pw-dp");
    let mut toml = airbench("pw", "patch_whitening", "samples = 64\nbias_epochs = 1");
    toml.max_duration = "2ep".to_owned();
    dir.write("trainer.toml", &short_epochs(&toml));
    let outputs = train_ranks(&dir, 2, &[]);
    assert_all_succeeded(&outputs);
    // Each rank computed filters from its own 64 samples; rank 0's went to every rank (the
    // run's checkpoints are rank 0's): a whitening pair, unchanged through the run.
    let first = read(&dir, "pw", "ep1-ba1.ckpt");
    let last = read(&dir, "pw", "ep2-ba2.ckpt");
    let w = model_tensor(&first, "whiten.weight");
    assert!(w.narrow(0, 4, 4).equal(&-w.narrow(0, 0, 4)));
    assert!(w.equal(&model_tensor(&last, "whiten.weight")));
    assert!(w.abs().sum(Kind::Float).double_value(&[]) > 0.0);
    let record = read_json(&run_dir(&dir, "pw").join("run.json"));
    assert_eq!(record["samples"], 2 * 128, "{record:#}");
    assert!(
        !last
            .meta
            .optimizer
            .members
            .iter()
            .any(|m| m.starts_with("whiten.")),
        "{:?}",
        last.meta.optimizer.members
    );
}

#[test]
fn a_model_without_a_whitening_ready_first_conv_is_refused() {
    let dir = TempDir::new("pw-refused");
    // The cnn's first conv is 3x3 with 8 channels: whitening would need 2·1·3·3 = 18.
    let toml = TrainerToml::new("pw").algorithm("patch_whitening", "samples = 64");
    toml.write_to(&dir);
    train(&dir, &[], &[]).assert_failure(&["patch_whitening", "`features.0.weight`", "18"]);
}
