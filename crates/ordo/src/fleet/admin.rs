//! What `ordo fleet` does: add, remove and list a fleet's peers in etcd. Any etcd client
//! may do the same with the layout of [`super::record`].

use super::record::{self, FleetPeer};
use super::store::Dial;
use super::FleetSettings;
use anyhow::{Context, Result};
use etcd_client::GetOptions;
use ordo_proto::PublicKey;

/// A fleet's records, read and written from a command.
pub struct Admin {
    prefix: String,
    dial: Dial,
    runtime: tokio::runtime::Runtime,
}

/// The records of a fleet, and those that were refused.
pub struct Listing {
    pub peers: Vec<(PublicKey, FleetPeer)>,
    pub refused: Vec<record::Refused>,
}

impl Admin {
    pub fn new(settings: &FleetSettings) -> Result<Admin> {
        Ok(Admin {
            prefix: settings.prefix().context("no fleet name")?,
            dial: Dial::prepare(settings)?,
            runtime: tokio::runtime::Builder::new_current_thread().enable_all().build()?,
        })
    }

    /// Writes `peer`'s record (replacing any it had).
    pub fn put(&self, key: &PublicKey, peer: &FleetPeer) -> Result<()> {
        let value = serde_json::to_string(peer)?;
        self.runtime.block_on(async {
            let mut client = self.dial.connect().await?;
            client.put(record::peer_key(&self.prefix, key), value, None).await?;
            Ok(())
        })
    }

    /// Deletes `key`'s record; false if there was none.
    pub fn delete(&self, key: &PublicKey) -> Result<bool> {
        self.runtime.block_on(async {
            let mut client = self.dial.connect().await?;
            let r = client.delete(record::peer_key(&self.prefix, key), None).await?;
            Ok(r.deleted() > 0)
        })
    }

    /// Every record of the fleet.
    pub fn list(&self) -> Result<Listing> {
        self.runtime.block_on(async {
            let mut client = self.dial.connect().await?;
            let prefix = record::peers_prefix(&self.prefix);
            let r = client.get(prefix, Some(GetOptions::new().with_prefix())).await?;
            let mut listing = Listing {
                peers: Vec::new(),
                refused: Vec::new(),
            };
            for kv in r.kvs() {
                match record::parse_record(&self.prefix, kv.key(), kv.value()) {
                    Ok(p) => listing.peers.push(p),
                    Err(e) => listing.refused.push(e),
                }
            }
            Ok(listing)
        })
    }
}
