//! libFuzzer's inputs to the `cpu_list` target (`ordo_fuzz_targets::text::cpu_list` says what it checks).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ordo_fuzz_targets::text::cpu_list(data));
