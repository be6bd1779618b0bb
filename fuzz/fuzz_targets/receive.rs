//! libFuzzer's inputs to the `receive` target (`ordo_fuzz_targets::proto::receive` says what it checks).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ordo_fuzz_targets::proto::receive(data));
