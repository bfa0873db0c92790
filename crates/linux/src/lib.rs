//! The kernel-facing parts of crust. Every raw syscall and every `unsafe`
//! block of the project lives in this crate, behind safe functions.

pub mod cgroups;
