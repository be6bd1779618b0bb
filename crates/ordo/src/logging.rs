//! The daemon's log: levels by wireguard-go's `LOG_LEVEL` convention, through env_logger.
//!
//! | `LOG_LEVEL` | what is logged |
//! |---|---|
//! | `verbose` (or `debug`) | everything below, and per-packet events: drops with their reason and source, handshakes (at most a few lines a second of each kind: `ordo_proto::events`) |
//! | `info` (Ordo's default) | the interface's start (port, model, queues, outer path), fallbacks, placement's releases, shutdown |
//! | `error` | what went wrong: errors and warnings |
//! | `silent` | nothing |
//!
//! Each line: a UTC timestamp, the level, `ordo[IFNAME]:` and the message. Other crates'
//! records (smoltcp's, the HTTP parser's) only from warnings up, but the netlink crates'
//! ([`CHATTY`]) only at `verbose`: their warnings are about their own parsing (a kernel newer
//! than they know of), nothing an operator can act on. No line carries a private or
//! preshared key: keys print as `<redacted>` (`ordo_proto::keys`), and peers are named by
//! public key.

use log::LevelFilter;
use std::io::Write;

/// The environment variable, as wireguard-go names it.
pub const LEVEL_ENV: &str = "LOG_LEVEL";

/// Crates whose warnings are internal chatter: shown at `verbose` only.
pub const CHATTY: &[&str] = &[
    "netlink_packet_core",
    "netlink_packet_route",
    "netlink_packet_utils",
    "netlink_proto",
    "netlink_sys",
    "rtnetlink",
];

/// What each module logs at `filter` (Ordo's level): Ordo's own at it, [`CHATTY`] crates
/// at `verbose` only, every other crate from warnings up (the `None` entry).
pub fn module_levels(filter: LevelFilter) -> Vec<(Option<&'static str>, LevelFilter)> {
    let chatty = if filter >= LevelFilter::Debug {
        LevelFilter::Debug
    } else {
        LevelFilter::Off
    };
    let mut levels = vec![
        (None, filter.min(LevelFilter::Warn)),
        (Some("ordo"), filter),
        (Some("ordo_proto"), filter),
    ];
    levels.extend(CHATTY.iter().map(|c| (Some(*c), chatty)));
    levels
}

/// The level `value` of `LOG_LEVEL` asks for (`default` when unset or empty).
pub fn level(value: Option<&str>, default: LevelFilter) -> Result<LevelFilter, String> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") => Ok(default),
        Some("verbose") | Some("debug") => Ok(LevelFilter::Debug),
        Some("info") => Ok(LevelFilter::Info),
        Some("error") => Ok(LevelFilter::Warn),
        Some("silent") => Ok(LevelFilter::Off),
        Some(other) => Err(format!("{LEVEL_ENV}={other}: expected verbose, info, error or silent")),
    }
}

/// Sets up the log of interface `name` from `LOG_LEVEL`, at `default` without it. An
/// unknown value is said and the default used; a second call changes nothing.
pub fn init(name: &str, default: LevelFilter) {
    let wanted = std::env::var(LEVEL_ENV).ok();
    let (filter, complaint) = match level(wanted.as_deref(), default) {
        Ok(f) => (f, None),
        Err(e) => (default, Some(e)),
    };
    let name = name.to_string();
    let mut builder = env_logger::Builder::new();
    for (module, level) in module_levels(filter) {
        builder.filter(module, level);
    }
    let _ = builder
        .format(move |buf, record| {
            writeln!(
                buf,
                "{} {:<5} ordo[{name}]: {}",
                buf.timestamp_millis(),
                record.level(),
                record.args()
            )
        })
        .try_init();
    if let Some(e) = complaint {
        log::warn!("{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_level_follows_wireguard_go() {
        let d = LevelFilter::Info;
        assert_eq!(level(None, d), Ok(LevelFilter::Info));
        assert_eq!(level(Some("verbose"), d), Ok(LevelFilter::Debug));
        assert_eq!(level(Some("debug"), d), Ok(LevelFilter::Debug));
        assert_eq!(level(Some("error"), d), Ok(LevelFilter::Warn));
        assert_eq!(level(Some("SILENT"), d), Ok(LevelFilter::Off));
        assert!(level(Some("loud"), d)
            .unwrap_err()
            .contains("verbose, info, error or silent"));
    }

    #[test]
    fn netlink_chatter_is_heard_at_verbose_only() {
        let of = |filter, module: Option<&str>| {
            module_levels(filter)
                .into_iter()
                .find(|(m, _)| *m == module)
                .map(|(_, l)| l)
        };
        let route = Some("netlink_packet_route");
        assert_eq!(of(LevelFilter::Info, route), Some(LevelFilter::Off));
        assert_eq!(of(LevelFilter::Warn, route), Some(LevelFilter::Off));
        assert_eq!(of(LevelFilter::Debug, route), Some(LevelFilter::Debug));
        assert_eq!(of(LevelFilter::Info, Some("ordo")), Some(LevelFilter::Info));
        assert_eq!(
            of(LevelFilter::Info, None),
            Some(LevelFilter::Warn),
            "other crates' warnings"
        );
        assert_eq!(of(LevelFilter::Off, None), Some(LevelFilter::Off));
    }
}
