//! libFuzzer's inputs to the `loadgen_wire` target (`ordo_fuzz_targets::text::loadgen_wire` says what it checks).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ordo_fuzz_targets::text::loadgen_wire(data));
