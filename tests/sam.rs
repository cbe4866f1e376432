//! Integration tests of the sam plugin through the real binary (being written).
