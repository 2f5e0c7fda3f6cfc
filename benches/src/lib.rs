//! `devcomm-benches`: benchmarks that print nccl-tests-style tables (size,
//! time, algbw, busbw) next to NCCL measured in the same run. Benchmarks land
//! with the features they measure; results go to `benches/results/`.
#![warn(missing_docs)]
