//! What the core tells an operator's log as it works: drops with their reason and, where
//! known, their source; handshakes begun and completed. All at the `log` facade's debug
//! level (the daemon's `LOG_LEVEL=verbose`), and per-packet events at most
//! [`PER_SECOND`] a second per kind, so that a flood of bad datagrams cannot become a flood
//! of log lines. Lines name peers by public key, never a private or preshared key.

use std::time::{Duration, Instant};

/// Lines of one kind a second at most; the rest are counted and reported with the next one.
pub const PER_SECOND: u32 = 5;

/// The rate limit of each kind of event.
#[derive(Debug, Default)]
pub struct Events {
    windows: Vec<(&'static str, Window)>,
}

#[derive(Debug)]
struct Window {
    start: Instant,
    logged: u32,
    suppressed: u64,
}

impl Events {
    /// Logs `line()` at debug level unless events of `kind` had their share of the current
    /// second; the line is built only if it is logged, and the clock read only if debug
    /// logging is on.
    pub fn debug(&mut self, kind: &'static str, line: impl FnOnce() -> String) {
        if !log::log_enabled!(log::Level::Debug) {
            return;
        }
        self.debug_at(Instant::now(), kind, line);
    }

    fn debug_at(&mut self, now: Instant, kind: &'static str, line: impl FnOnce() -> String) {
        let at = match self.windows.iter().position(|(k, _)| *k == kind) {
            Some(at) => at,
            None => {
                self.windows.push((
                    kind,
                    Window {
                        start: now,
                        logged: 0,
                        suppressed: 0,
                    },
                ));
                self.windows.len() - 1
            }
        };
        let w = &mut self.windows[at].1;
        if now.saturating_duration_since(w.start) >= Duration::from_secs(1) {
            if w.suppressed > 0 {
                log::debug!(
                    "{} more {kind} events not logged (at most {PER_SECOND} a second)",
                    w.suppressed
                );
            }
            *w = Window {
                start: now,
                logged: 0,
                suppressed: 0,
            };
        }
        if w.logged < PER_SECOND {
            w.logged += 1;
            let line = line();
            log::debug!("{line}");
        } else {
            w.suppressed += 1;
        }
    }

    /// How many events of `kind` the current window has held back.
    #[cfg(test)]
    fn suppressed(&self, kind: &str) -> u64 {
        self.windows
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, w)| w.suppressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_logs_a_few_lines_a_second_and_counts_the_rest() {
        let t0 = Instant::now();
        let mut e = Events::default();
        let mut built = 0;
        for _ in 0..100 {
            e.debug_at(t0, "drops", || {
                built += 1;
                String::new()
            });
        }
        assert_eq!(built, PER_SECOND as usize, "lines past the limit are never built");
        assert_eq!(e.suppressed("drops"), 100 - u64::from(PER_SECOND));
        // Another kind has its own share.
        e.debug_at(t0, "handshakes", String::new);
        assert_eq!(e.suppressed("handshakes"), 0);
        // A second later the window starts again.
        e.debug_at(t0 + Duration::from_secs(1), "drops", String::new);
        assert_eq!(e.suppressed("drops"), 0);
    }
}
