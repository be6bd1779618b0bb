//! libFuzzer's inputs to the `session` target (`ordo_fuzz_targets::session::run` says what it checks).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ordo_fuzz_targets::session::run(data));
