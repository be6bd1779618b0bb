//! libFuzzer's inputs to the `attach` target (`ordo_fuzz_targets::attach::run` says what it checks).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ordo_fuzz_targets::attach::run(data));
