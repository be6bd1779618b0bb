//! The service's UDP requests: connected and bound UDP sockets of the stack (their relay is
//! [`crate::inner::stack::datagram`]).

use super::fd::{errno_of, set_nonblocking};
use super::{State, MAX_CONNECTIONS};
use crate::inner::stack::datagram;
use crate::inner::stack::datagram::Flow;
use smoltcp::socket::udp;
use smoltcp::wire::{IpAddress, IpEndpoint, IpListenEndpoint};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};

impl State {
    /// Connects a UDP socket of the stack to `to` for `app`: bound to our address of `to`'s
    /// family and a free port. Nothing is sent yet, as with the kernel's connect on UDP.
    pub(super) fn connect_datagram(&mut self, to: SocketAddr, app: OwnedFd, uid: u32) -> Result<SocketAddr, i32> {
        if self.connections.len() + self.flows.len() >= MAX_CONNECTIONS {
            return Err(libc::EMFILE);
        }
        let ip = *self
            .addresses
            .iter()
            .find(|a| a.is_ipv4() == to.is_ipv4())
            .ok_or(libc::EADDRNOTAVAIL)?;
        if to.port() == 0 {
            return Err(libc::EINVAL);
        }
        set_nonblocking(app.as_raw_fd()).map_err(|e| errno_of(&e))?;
        let local_port = self.take_udp_port().ok_or(libc::EADDRNOTAVAIL)?;
        let socket = datagram::new_socket(IpListenEndpoint {
            addr: Some(IpAddress::from(ip)),
            port: local_port,
        });
        self.flows.push(Flow {
            handle: self.sockets.add(socket),
            uid,
            app: self.watcher.watch(app),
            local_port,
            remote: Some(datagram::Remote::Tunnel(IpEndpoint::new(
                IpAddress::from(to.ip()),
                to.port(),
            ))),
            takes: datagram::Families::Both,
            host: None,
            marker: None,
            mtu: self.link.mtu,
        });
        Ok(SocketAddr::new(ip, local_port))
    }

    /// Binds an unconnected UDP socket of the stack to `local` (one of the stack's
    /// addresses, or the unspecified address for all of them; port 0 for a free one) for
    /// `app`, relaying its kernel socket `host` too if it brought one. Returns its address
    /// and the marker its headers start with.
    pub(super) fn bind_datagram(
        &mut self,
        mut local: SocketAddr,
        v6_only: bool,
        app: OwnedFd,
        host: Option<UdpSocket>,
        uid: u32,
    ) -> Result<(SocketAddr, [u8; 8]), i32> {
        if self.connections.len() + self.flows.len() >= MAX_CONNECTIONS {
            return Err(libc::EMFILE);
        }
        let wildcard = local.ip().is_unspecified();
        if !wildcard && !self.addresses.contains(&local.ip()) {
            return Err(libc::EADDRNOTAVAIL);
        }
        set_nonblocking(app.as_raw_fd()).map_err(|e| errno_of(&e))?;
        if local.port() == 0 {
            local.set_port(self.take_udp_port().ok_or(libc::EADDRNOTAVAIL)?);
        } else if !self.udp_ports_in_use.insert(local.port()) {
            return Err(libc::EADDRINUSE);
        }
        // As in `listen`: the program's socket changed only once the answer is yes.
        if let Some(Err(e)) = host.as_ref().map(|h| h.set_nonblocking(true)) {
            self.udp_ports_in_use.remove(&local.port());
            return Err(errno_of(&e));
        }
        let socket = datagram::new_socket(IpListenEndpoint {
            addr: (!wildcard).then(|| IpAddress::from(local.ip())),
            port: local.port(),
        });
        let mut marker = [0u8; ordo_attach::MARKER_LEN];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut marker);
        self.flows.push(Flow {
            handle: self.sockets.add(socket),
            uid,
            app: self.watcher.watch(app),
            local_port: local.port(),
            remote: None,
            takes: match local.ip() {
                IpAddr::V4(_) => datagram::Families::V4,
                IpAddr::V6(_) if v6_only || !wildcard => datagram::Families::V6,
                IpAddr::V6(_) => datagram::Families::Both,
            },
            host: host.map(|h| self.watcher.watch(h)),
            marker: Some(marker),
            mtu: self.link.mtu,
        });
        Ok((local, marker))
    }

    /// Each flow's turn; a flow whose application closed its end is removed.
    pub(super) fn relay_datagrams(&mut self) {
        let mut i = 0;
        while i < self.flows.len() {
            let f = &mut self.flows[i];
            let s = self.sockets.get_mut::<udp::Socket>(f.handle);
            if datagram::relay(f, s, &mut self.scratch, &self.link.wires.datagram_drops, &self.ready) {
                i += 1;
                continue;
            }
            let f = self.flows.swap_remove(i);
            self.sockets.remove(f.handle);
            self.udp_ports_in_use.remove(&f.local_port);
        }
    }
}
