//! The endpoint's HTTP side: `GET /metrics` answers with the device's figures, anything else
//! with 404 or 405. One thread answers one request at a time, so that scrapes never compete
//! with each other for the device's locks; a scrape reads the device for a few milliseconds.

use super::exposition;
use crate::device::Device;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use tiny_http::{Header, Method, Response, Server};

/// The endpoint's socket, bound (before the daemon gives up its privileges) and not yet
/// answering.
pub struct Endpoint {
    server: Server,
    address: SocketAddr,
}

impl Endpoint {
    pub fn bind(address: SocketAddr) -> io::Result<Endpoint> {
        let server = Server::http(address)
            .map_err(|e| io::Error::other(format!("cannot listen for metrics on {address}: {e}")))?;
        let address = server.server_addr().to_ip().unwrap_or(address);
        Ok(Endpoint { server, address })
    }

    /// Where it listens (the port the kernel chose, for port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Answers requests on a thread of its own until the process ends.
    pub fn serve(self, device: Arc<Device>) -> io::Result<()> {
        std::thread::Builder::new().name("ordo-metrics".into()).spawn(move || {
            for request in self.server.incoming_requests() {
                let path = request.url().split('?').next().unwrap_or("");
                let response = match (request.method(), path) {
                    (Method::Get, "/metrics") => {
                        let header =
                            Header::from_bytes("Content-Type", exposition::CONTENT_TYPE).expect("a valid header");
                        Response::from_string(exposition::render(&device)).with_header(header)
                    }
                    (Method::Get, _) => Response::from_string("Ordo: metrics at /metrics\n").with_status_code(404),
                    _ => Response::from_string("only GET\n").with_status_code(405),
                };
                // A client that went away is its own business.
                let _ = request.respond(response);
            }
        })?;
        Ok(())
    }
}
