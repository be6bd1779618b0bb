//! Any text as a wg-quick file: a config or an error naming a line of it, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = ordo::config::wgquick::parse(text, std::path::Path::new("fuzz.conf")) {
            assert!(e.line <= text.lines().count());
        }
    }
});
