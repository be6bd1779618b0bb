//! libFuzzer's inputs to the `wgquick` target (`ordo_fuzz_targets::text::wgquick` says what it checks).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ordo_fuzz_targets::text::wgquick(data));
