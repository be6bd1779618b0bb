//! The etcd connection: dialled with TLS if the settings name certificates, with HTTP/2
//! keepalives so that a cut link is noticed within seconds rather than when the kernel gives
//! up on the TCP connection.

use super::FleetSettings;
use anyhow::{Context, Result};
use etcd_client::{Certificate, Client, ConnectOptions, Identity, LeaseKeepAliveStream, LeaseKeeper, TlsOptions};
use std::time::Duration;

/// How often the connection is probed, and how long a probe may go unanswered. etcd closes
/// the connection of a client that probes more often than every 5 s (its
/// `--grpc-keepalive-min-time`), so a cut link is noticed within about 9 s; a member that
/// stops closes its connections, which is noticed at once.
const KEEPALIVE: Duration = Duration::from_secs(6);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest a connection attempt or a request takes before it counts as failed.
const TIMEOUT: Duration = Duration::from_secs(3);

/// What dialling etcd needs, the files already read: a daemon reads them before it drops
/// its privileges, after which they may no longer be readable.
#[derive(Clone)]
pub struct Dial {
    endpoints: Vec<String>,
    tls: Option<TlsOptions>,
}

impl Dial {
    pub fn prepare(settings: &FleetSettings) -> Result<Dial> {
        let read = |p: &std::path::PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        let tls = match (&settings.ca, &settings.cert, &settings.key) {
            (None, None, None) => None,
            (ca, cert, key) => {
                let mut tls = TlsOptions::new();
                if let Some(ca) = ca {
                    tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
                }
                match (cert, key) {
                    (Some(cert), Some(key)) => {
                        // tonic copies the key into its own configuration; ours is wiped.
                        let key = zeroize::Zeroizing::new(read(key)?);
                        tls = tls.identity(Identity::from_pem(read(cert)?, key.as_slice()));
                    }
                    (None, None) => {}
                    _ => anyhow::bail!("an etcd client certificate and its key go together"),
                }
                Some(tls)
            }
        };
        Ok(Dial {
            endpoints: settings.endpoints(),
            tls,
        })
    }

    pub async fn connect(&self) -> Result<Client> {
        let mut options = ConnectOptions::new()
            .with_keep_alive(KEEPALIVE, KEEPALIVE_TIMEOUT)
            .with_keep_alive_while_idle(true)
            .with_connect_timeout(TIMEOUT);
        if let Some(tls) = &self.tls {
            options = options.with_tls(tls.clone());
        }
        Client::connect(&self.endpoints, Some(options))
            .await
            .with_context(|| format!("connecting to etcd at {}", self.endpoints.join(",")))
    }

    pub fn endpoints(&self) -> String {
        self.endpoints.join(",")
    }
}

/// A lease of ours, kept alive while its holder lives: the keys put on it go when it stops
/// being renewed (the holder died, or lost etcd for longer than the lease's time to live).
pub struct Lease {
    pub id: i64,
    pub ttl: Duration,
    keeper: LeaseKeeper,
    answers: LeaseKeepAliveStream,
}

impl Lease {
    pub async fn grant(client: &mut Client, ttl: Duration) -> Result<Lease> {
        let granted = client
            .lease_grant(ttl.as_secs() as i64, None)
            .await
            .context("granting a lease")?;
        let (keeper, answers) = client.lease_keep_alive(granted.id()).await.context("keeping a lease")?;
        Ok(Lease {
            id: granted.id(),
            ttl: Duration::from_secs(granted.ttl().max(1) as u64),
            keeper,
            answers,
        })
    }

    /// How often to renew: three times per time to live, so that one lost renewal costs
    /// nothing.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// Renews the lease; an error if etcd says it has expired meanwhile.
    pub async fn renew(&mut self) -> Result<()> {
        self.keeper.keep_alive().await.context("renewing a lease")?;
        let answer = tokio::time::timeout(TIMEOUT, self.answers.message())
            .await
            .context("renewing a lease: no answer")??
            .context("etcd ended the lease's stream")?;
        anyhow::ensure!(answer.ttl() > 0, "lease {:x} expired", self.id);
        Ok(())
    }
}
