//! Integration tests of the ema plugin through the real binary (being written).
