//! `devcomm-gin`: the host side of GIN, devcomm's GPU-initiated networking.
//!
//! This crate will hold the backends that serve device-initiated puts and
//! signals between GPUs that cannot load/store each other: the proxy engine
//! (a CPU progress thread consuming GPU-posted descriptors) and its
//! transports (copy engine, TCP, verbs), the GDAKI queue model and the GPI
//! probe. See DESIGN.md, section 6. It is empty until that work lands
//! (issue "GIN: device-initiated network operations").
#![warn(missing_docs)]
