//! Integration tests of the blurpool plugin through the real binary (being written).
