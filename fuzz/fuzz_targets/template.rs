#![no_main]
//! See checks/mod.rs for what this target checks.

#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::template(data));
