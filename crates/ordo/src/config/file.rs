//! A wg-quick file read from disk: its permissions checked (it holds a private key, and its
//! hooks may run as root), its text wiped once parsed; and the UAPI `set` request that
//! configures an interface as it says.

use super::wgquick::{self, WgQuickConfig};
use crate::secret_text::SecretText;
use anyhow::{Context, Result};
use std::fmt::Write;
use std::net::ToSocketAddrs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use zeroize::Zeroizing;

/// What a config file's mode exposes: its private key to readers, and (its PostUp and
/// PreDown run as root) root to writers other than its owner.
pub fn permission_warnings(path: &Path, mode: u32) -> Vec<String> {
    let mut w = Vec::new();
    if mode & 0o044 != 0 {
        w.push(format!(
            "warning: {} is readable by group or others and holds a private key; chmod 600 it",
            path.display()
        ));
    }
    if mode & 0o022 != 0 {
        w.push(format!(
            "warning: {} is writable by group or others, and its PreUp/PostUp commands run as root; chmod 600 it",
            path.display()
        ));
    }
    w
}

pub fn load(path: &Path) -> Result<WgQuickConfig> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    for w in permission_warnings(path, meta.permissions().mode()) {
        eprintln!("{w}");
    }
    // Read in one allocation (fs::read sizes it from the file) and wiped when done: the text
    // holds the private key.
    let bytes = Zeroizing::new(std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?);
    let text = std::str::from_utf8(&bytes).with_context(|| format!("{}: not UTF-8 text", path.display()))?;
    let cfg = wgquick::parse(text, path)?;
    for (line, key) in &cfg.interface.ignored {
        eprintln!(
            "warning: {}:{line}: {key} is not handled by ordo and is ignored",
            path.display()
        );
    }
    Ok(cfg)
}

/// The UAPI `set` request that configures the interface as the file says.
pub fn set_request(cfg: &WgQuickConfig, fwmark: Option<u32>) -> Result<SecretText> {
    let i = &cfg.interface;
    // It carries the private and pre-shared keys: erased when dropped.
    let mut s = SecretText::new();
    s.push_str("set=1\n");
    if let Some(k) = &i.private_key {
        let _ = writeln!(s, "private_key={}", k.to_hex().as_str());
    }
    if let Some(p) = i.listen_port {
        let _ = writeln!(s, "listen_port={p}");
    }
    if let Some(m) = fwmark {
        let _ = writeln!(s, "fwmark={m}");
    }
    s.push_str("replace_peers=true\n");
    for p in &cfg.peers {
        let _ = writeln!(s, "public_key={}", p.public_key.to_hex());
        if let Some(psk) = &p.preshared_key {
            let _ = writeln!(s, "preshared_key={}", psk.to_hex().as_str());
        }
        if let Some((host, port)) = &p.endpoint {
            let addr = (host.as_str(), *port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .with_context(|| format!("line {}: cannot resolve endpoint {host}", p.line))?;
            let _ = writeln!(s, "endpoint={addr}");
        }
        if let Some(k) = p.persistent_keepalive {
            let _ = writeln!(s, "persistent_keepalive_interval={k}");
        }
        s.push_str("replace_allowed_ips=true\n");
        for a in &p.allowed_ips {
            let _ = writeln!(s, "allowed_ip={a}");
        }
    }
    s.push_str("\n");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_readable_or_writable_by_others_is_warned_about() {
        let p = Path::new("wg0.conf");
        assert!(permission_warnings(p, 0o600).is_empty());
        assert!(permission_warnings(p, 0o400).is_empty());
        let w = permission_warnings(p, 0o644);
        assert!(w.len() == 1 && w[0].contains("readable"), "{w:?}");
        let w = permission_warnings(p, 0o620);
        assert!(
            w.len() == 1 && w[0].contains("writable") && w[0].contains("root"),
            "{w:?}"
        );
        assert_eq!(permission_warnings(p, 0o666).len(), 2);
        assert_eq!(permission_warnings(p, 0o602).len(), 1);
    }
}
