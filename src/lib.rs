//! The composition of Hindsight's services over the embedded backends,
//! shared by the `hindsight` binary and the benchmarks.

pub mod app;
