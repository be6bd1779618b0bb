//! libFuzzer's inputs to the `ip_headers` target (`ordo_fuzz_targets::packets::ip_headers` says what it checks).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ordo_fuzz_targets::packets::ip_headers(data));
