//! Data: image folders, MDS and WebDataset shards, S3, image and sample transforms, damaged data
//! files.
//!
//! One of the few test binaries (tests/Cargo.toml): cargo links it once, and its tests share one
//! pool of test threads. Each file below is one feature or method; docs/testing.md lists them.

mod data_errors;
mod folder;
mod image_transforms;
mod s3;
mod sample_transforms;
mod streaming;
