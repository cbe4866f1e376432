//! Integration tests of the selective_backprop plugin through the real binary (being written).
