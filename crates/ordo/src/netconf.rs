//! Addresses, routes and rules over rtnetlink, for `ordo up` and `ordo down`: what wg-quick
//! does with the `ip` command, done without shelling out.

use anyhow::{anyhow, Context, Result};
use futures::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleFlags};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, IpVersion, LinkUnspec, RouteMessageBuilder, RuleAddRequest};
use std::net::IpAddr;

async fn exec_rule<T>(mut r: RuleAddRequest<T>, invert: bool, suppress_default: bool) -> Result<(), rtnetlink::Error> {
    if invert {
        r.message_mut().header.flags |= RuleFlags::Invert;
    }
    if suppress_default {
        r.message_mut().attributes.push(RuleAttribute::SuppressPrefixLen(0));
    }
    r.execute().await
}

/// The route for `net` through interface `index` in `table`.
fn route_message(index: u32, net: IpNet, table: u32) -> Result<rtnetlink::packet_route::route::RouteMessage> {
    Ok(RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(net.network(), net.prefix_len())
        .map_err(|e| anyhow!("route {net}: {e:?}"))?
        .output_interface(index)
        .table_id(table)
        .build())
}

/// A netlink connection driven by a small single-threaded runtime of its own, so the rest
/// of Ordo stays free of async.
pub struct Netlink {
    rt: tokio::runtime::Runtime,
    handle: Handle,
}

impl Netlink {
    pub fn open() -> Result<Netlink> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = rt.block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection()?;
            tokio::spawn(conn);
            Ok::<_, std::io::Error>(handle)
        })?;
        Ok(Netlink { rt, handle })
    }

    pub fn link_index(&self, name: &str) -> Result<u32> {
        let h = self.handle.clone();
        self.rt.block_on(async {
            let mut links = h.link().get().match_name(name.to_string()).execute();
            match links.try_next().await {
                Ok(Some(l)) => Ok(l.header.index),
                Ok(None) => Err(anyhow!("no interface named {name}")),
                Err(e) => Err(anyhow!("looking up interface {name}: {e}")),
            }
        })
    }

    pub fn set_mtu_and_up(&self, index: u32, mtu: u32) -> Result<()> {
        let h = self.handle.clone();
        self.rt
            .block_on(
                h.link()
                    .set(LinkUnspec::new_with_index(index).mtu(mtu).up().build())
                    .execute(),
            )
            .with_context(|| format!("setting MTU {mtu} and bringing the link up"))
    }

    pub fn add_address(&self, index: u32, net: IpNet) -> Result<()> {
        let h = self.handle.clone();
        self.rt
            .block_on(h.address().add(index, net.addr(), net.prefix_len()).execute())
            .with_context(|| format!("adding address {net}"))
    }

    /// Adds a route for `net` through the interface into `table` (254 is main).
    pub fn add_route(&self, index: u32, net: IpNet, table: u32) -> Result<()> {
        let h = self.handle.clone();
        let msg = route_message(index, net, table)?;
        self.rt
            .block_on(h.route().add(msg).replace().execute())
            .with_context(|| format!("adding route {net} (table {table})"))
    }

    /// Removes the route for `net` through the interface from `table`; none there is no
    /// error.
    pub fn delete_route(&self, index: u32, net: IpNet, table: u32) -> Result<()> {
        let h = self.handle.clone();
        let msg = route_message(index, net, table)?;
        match self.rt.block_on(h.route().del(msg).execute()) {
            Ok(()) => Ok(()),
            // ESRCH: no such route.
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ESRCH => Ok(()),
            Err(e) => Err(anyhow!("removing route {net} (table {table}): {e}")),
        }
    }

    /// wg-quick's default-route scheme: packets without `mark` look up `table`, which routes
    /// everything into the tunnel; the tunnel's own outer packets carry `mark` and use the
    /// main table, whose default route is ignored for everything else.
    pub fn add_default_route_rules(&self, v6: bool, mark: u32, table: u32) -> Result<()> {
        let h = self.handle.clone();
        self.rt
            .block_on(async {
                let not_marked = h.rule().add().fw_mark(mark).table_id(table).action(RuleAction::ToTable);
                let main_without_default = h.rule().add().table_id(254).action(RuleAction::ToTable);
                if v6 {
                    exec_rule(not_marked.v6(), true, false).await?;
                    exec_rule(main_without_default.v6(), false, true).await
                } else {
                    exec_rule(not_marked.v4(), true, false).await?;
                    exec_rule(main_without_default.v4(), false, true).await
                }
            })
            .with_context(|| format!("adding the policy rules for a default route (fwmark {mark}, table {table})"))
    }

    pub fn delete_link(&self, index: u32) -> Result<()> {
        let h = self.handle.clone();
        self.rt
            .block_on(h.link().del(index).execute())
            .context("deleting the interface")
    }

    /// Rules that point at `table`, or that suppress the main table's default route.
    pub fn delete_default_route_rules(&self, table: u32) -> Result<()> {
        let h = self.handle.clone();
        self.rt.block_on(async {
            for v in [IpVersion::V4, IpVersion::V6] {
                let rules: Vec<_> = h.rule().get(v).execute().try_collect().await.unwrap_or_default();
                for r in rules {
                    let ours = r
                        .attributes
                        .iter()
                        .any(|a| matches!(a, RuleAttribute::Table(t) if *t == table))
                        || r.attributes
                            .iter()
                            .any(|a| matches!(a, RuleAttribute::SuppressPrefixLen(0)));
                    if ours && r.header.family != AddressFamily::Unspec {
                        let _ = h.rule().del(r).execute().await;
                    }
                }
            }
            Ok(())
        })
    }
}
