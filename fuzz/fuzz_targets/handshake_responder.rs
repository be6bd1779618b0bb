//! libFuzzer's inputs to the `handshake_responder` target (`ordo_fuzz_targets::proto::handshake_responder` says what it checks).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ordo_fuzz_targets::proto::handshake_responder(data));
