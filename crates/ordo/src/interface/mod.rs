//! An Ordo interface as a whole: the one order in which any interface comes up and goes down
//! ([`lifecycle`]), from its settings (`crate::settings`); a TUN interface ([`run_tun`]); and
//! the two kinds whose inner side is Ordo's own TCP/IP stack: a private one in this process
//! ([`stack`], for `ordo run`) and a shared one that programs attach to ([`shared`], `ordo up`
//! of an `Inner = stack` file).

pub mod lifecycle;
pub mod shared;
pub mod stack;

use crate::daemon::privileges::Privileges;
use crate::settings::InterfaceSettings;
use anyhow::Result;
use lifecycle::{Bringup, Inner};

/// Runs a TUN interface as the xplatform interface demands of `ordo -f IFNAME`, until it is
/// deleted, its UAPI socket removed, or a signal arrives; `ordo up` configures it over the
/// UAPI socket once it is ready.
pub fn run_tun(name: &str, privileges: &Privileges, settings: &InterfaceSettings) -> Result<()> {
    let up = Bringup {
        name,
        settings: settings.clone(),
        privileges: privileges.clone(),
        inner: Inner::Tun,
        daemon: true,
    }
    .start()?;
    up.wait();
    Ok(())
}
