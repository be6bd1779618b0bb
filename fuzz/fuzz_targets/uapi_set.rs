//! libFuzzer's inputs to the `uapi_set` target (`ordo_fuzz_targets::text::uapi_set` says what it checks).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ordo_fuzz_targets::text::uapi_set(data));
