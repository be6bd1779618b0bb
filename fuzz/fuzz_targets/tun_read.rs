//! libFuzzer's inputs to the `tun_read` target (`ordo_fuzz_targets::packets::tun_read` says what it checks).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ordo_fuzz_targets::packets::tun_read(data));
