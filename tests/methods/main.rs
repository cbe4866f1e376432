//! Every speed-up method through the real binary and real plugins: each method's own file (its
//! runs, ranks, export, goldens through the binary), the method table (`table.rs`: each method's
//! kill -9 resume and refused settings, one row per method, network and settings), all plugins
//! together, exports of method-changed networks, and the step's host reads.
//!
//! One of the few test binaries (tests/Cargo.toml): cargo links it once, and its tests share one
//! pool of test threads. Each file below is one feature or method; docs/testing.md lists them.

// Helpers several method files share (tests/support/), compiled once for this binary.
#[path = "../support/airbench.rs"]
mod airbench;
#[path = "../support/gpt2_golden.rs"]
mod gpt2_golden;
#[path = "../support/gpt_models.rs"]
mod gpt_models;
#[path = "../support/host_model.rs"]
mod host_model;
#[path = "../support/lm_export.rs"]
mod lm_export;
#[path = "../support/losses.rs"]
mod losses;
#[path = "../support/mixing.rs"]
mod mixing;

mod alibi;
mod all_plugins;
mod alternating_flip;
mod augmix;
mod batchnorm_tricks;
mod blurpool;
mod blurpool_model;
mod channels_last;
mod colout;
mod cutmix;
mod dirac_init;
mod early_stopping;
mod ema;
mod export_methods;
mod factorize;
mod gated_linear_units;
mod ghost_batchnorm;
mod gradient_clipping;
mod gyro_dropout;
mod host_reads;
mod layer_freezing;
mod logit_softcap;
mod lookahead;
mod low_precision_norms;
mod mixup;
mod modded_nanogpt;
mod muon;
mod patch_whitening;
mod progressive_resizing;
mod qk_norm;
mod randaugment;
mod relu_squared;
mod rotary;
mod sam;
mod selective_backprop;
mod seq_length_warmup;
mod squeeze_excite;
mod stochastic_depth;
mod swa;
mod table;
mod test_time_augmentation;
mod weight_standardization;
mod zero_init_projections;
