//! Experiment tracking: a run's parameters, metrics, record and weights sent to a tracking
//! server while it trains, and runs read back from one (see `docs/tracking.md`).
//!
//! Tracking never stops or slows a run: the trainer hands events to a background thread
//! through a bounded buffer and, at the end, waits for delivery at most a configured time.
//! Only MLflow (its REST API) is supported today, in [`mlflow`].

pub mod mlflow;
