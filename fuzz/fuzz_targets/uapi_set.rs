//! Any text as the body of a UAPI `set=1` request: a plan or an errno, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = ordo::uapi::protocol::parse_set(text.lines()) {
            assert!(e.errno > 0);
        }
    }
});
